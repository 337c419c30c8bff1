from specfleet.cli.main import main

raise SystemExit(main())
