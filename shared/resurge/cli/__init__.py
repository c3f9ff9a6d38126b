"""The ``resurge`` command: the parser and entry point (:mod:`.main`), the commands that
talk to a running cluster (:mod:`.cluster_commands`), and ``resurge schema``."""

from resurge.cli.main import main

__all__ = ["main"]
