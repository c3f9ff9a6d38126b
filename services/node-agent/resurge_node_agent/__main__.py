import sys

from resurge_node_agent.cli import main

sys.exit(main())
