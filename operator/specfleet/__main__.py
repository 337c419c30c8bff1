from specfleet.cli import main

raise SystemExit(main())
