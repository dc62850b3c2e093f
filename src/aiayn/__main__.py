"""``python -m aiayn ...``: the CLI, also as torchrun starts it (``torchrun ... -m aiayn``)."""

import sys

from aiayn.cli import main

sys.exit(main())
