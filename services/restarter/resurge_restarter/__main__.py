import sys

from resurge_restarter.cli import main

sys.exit(main())
