"""``python -m resurge_node_agent``: the same as ``resurge-node-agent``."""

import sys

from resurge_node_agent.cli import main

sys.exit(main())
