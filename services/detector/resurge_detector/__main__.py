import sys

from resurge_detector.cli import main

sys.exit(main())
