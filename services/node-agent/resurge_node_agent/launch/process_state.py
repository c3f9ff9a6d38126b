"""Whether a process is stopped (state ``T`` or ``t`` in ``/proc/<pid>/stat``).

A stopped process (SIGSTOP, SIGTSTP, a debugger's stop) runs no code: it cannot act
on SIGTERM nor make progress. Linux only; elsewhere, or for a process that is gone,
the answer is ``None`` (unknown).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["is_stopped"]


def is_stopped(pid: int) -> bool | None:
    """Whether ``pid`` is stopped; None when that cannot be known."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 3, after the command name in parentheses (which may itself hold spaces).
    fields = stat.rsplit(")", 1)[-1].split()
    return bool(fields) and fields[0] in ("T", "t")
