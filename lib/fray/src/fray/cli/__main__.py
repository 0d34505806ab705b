"""`python -m fray.cli`: the `fray` command."""

import sys

from fray.cli import main

sys.exit(main())
