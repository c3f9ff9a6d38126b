"""``python -m resurge_restarter``: the same as ``resurge-restarter``."""

import sys

from resurge_restarter.cli import main

sys.exit(main())
