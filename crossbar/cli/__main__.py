"""`python -m crossbar.cli`: the `crossbar` command."""

import sys

from crossbar.cli.main import main

sys.exit(main())
