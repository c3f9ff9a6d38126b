"""``python -m resurge_scaler``: the scaler service."""

import sys

from resurge_scaler.cli import main

sys.exit(main())
