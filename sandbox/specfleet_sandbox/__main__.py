"""`python -m specfleet_sandbox ...` is `specfleet sandbox ...`."""

import sys

from specfleet_sandbox.cli import main

sys.exit(main())
