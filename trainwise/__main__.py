"""`python -m trainwise` is the `trainwise` command (bench uses it to start fresh processes)."""

import sys

from trainwise.cli.main import main

sys.exit(main())
