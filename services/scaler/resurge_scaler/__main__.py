import sys

from resurge_scaler.cli import main

sys.exit(main())
