"""The ``resurge`` command: the parser and entry point (:mod:`.main`), one module per
command (:mod:`.commands`), how a command reaches its cluster (:mod:`.connect`), and the
views the commands print (:mod:`.status`, :mod:`.events`, :mod:`.report`,
:mod:`.schemas`)."""

from resurge.cli.main import main

__all__ = ["main"]
