"""Dying with one's parent: Linux's parent-death signal, without its start-up race.

:func:`die_with_parent` asks the kernel to SIGKILL the calling process when the thread
that forked it ends (``prctl(PR_SET_PDEATHSIG)``), then checks that the parent it was
forked by is still the parent: one that died before the request took effect would
never send the signal. Used by the fork server (it dies with its agent) and by every
worker (it dies with whoever started it: the agent, or the fork server that dies with
the agent), so SIGKILLing an agent ends its workers at once instead of leaving them to
train alone until their collectives fail. Standard library only: the fork server and
a worker's pre-exec hook run it.

``prctl`` is looked up when this module is imported, not in the forked child: loading
a library after ``fork()`` in a process whose other threads may hold the loader's lock
(a resolver thread, say) could deadlock the child. Elsewhere than Linux it does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from collections.abc import Callable

__all__ = ["die_with_parent"]

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _find_prctl() -> Callable[[int, int], int] | None:
    with contextlib.suppress(OSError, AttributeError):
        prctl: Callable[[int, int], int] = ctypes.CDLL(None, use_errno=True).prctl
        return prctl
    return None


_PRCTL = _find_prctl()


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent dies; exit at once if it already has.

    ``parent``: the pid of the process that forked this one, read before the fork. The
    check is against that pid, not against init's: the parent may itself be pid 1 (an
    agent that is a container's entrypoint), and an orphan may be adopted by a subreaper.
    """
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)
