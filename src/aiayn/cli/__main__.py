"""``python -m aiayn.cli ...``: the same as ``aiayn ...``."""

import sys

from aiayn.cli import main

sys.exit(main())
