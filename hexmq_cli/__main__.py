"""`python -m hexmq_cli ...`: the `hexmq` command."""

import sys

from hexmq_cli.cli import main

sys.exit(main())
