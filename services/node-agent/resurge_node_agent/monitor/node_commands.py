"""Running a node's own command (a GPU reset, a health check) and saying how it went.

:func:`run_command` splits the command as a shell would (no shell runs it), runs it at
most ``bound`` seconds and returns None when it exited 0, else in words why not: it
could not run, or it exited non-zero, with the last line it printed.
"""

from __future__ import annotations

import shlex
import subprocess

__all__ = ["run_command"]


def run_command(command: str, bound: float) -> str | None:
    """Run ``command``: None if it exited 0, else why not (see the module docstring)."""
    try:
        argv = shlex.split(command)
        done = subprocess.run(argv, capture_output=True, text=True, timeout=bound)
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as error:
        return f"{command!r} could not run: {error}"
    if done.returncode == 0:
        return None
    said = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
    return f"{argv[0]} exited {done.returncode}: {said[0]}"
