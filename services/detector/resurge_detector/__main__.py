"""``python -m resurge_detector``: the detector service."""

import sys

from resurge_detector.cli import main

sys.exit(main())
