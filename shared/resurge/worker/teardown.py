"""Tear down ``torch.distributed`` between generations of an in-process restart.

Standard library only: torch is found in ``sys.modules`` (a worker that never imported
``torch.distributed`` has nothing to tear down) and never imported here.

:func:`teardown_process_groups` destroys every process group so that this rank's
connections close and peers blocked in a collective with it fail at once ("Connection
closed by peer") instead of waiting for the collective timeout. With gloo neither
``_abort_process_group`` nor ``ProcessGroup.shutdown`` closes them (measured with torch
2.13); only freeing the process group does, so the teardown makes sure nothing of
torch's keeps it:

- ``torch.distributed.nn.functional`` binds ``group=group.WORLD`` as default arguments
  when first imported, which DistributedDataParallel does while a group exists: those
  defaults pin that group for the life of the process. They are reset to None (which
  every collective reads as "the default group", what they meant).
- ``gc.collect()`` runs first, so a DDP wrapper in a reference cycle is freed while the
  group is still registered (torch 2.13 + gloo can deadlock when the DDP reducer drops
  the last reference to a group).

For other backends (NCCL) it aborts the group first, torch's way of ending collectives
in flight; that path has not been measured here.

:func:`is_collective_failure` says whether an exception looks like a collective failing
because a peer went away (a consequence, not a cause), by type (``DistError``) or by
gloo's and NCCL's words. A heuristic: used only to wait briefly before reporting.
"""

from __future__ import annotations

import gc
import os
import sys
import types
from typing import Any

__all__ = ["is_collective_failure", "teardown_process_groups"]

_COLLECTIVE_WORDS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "/gloo/",
    "NCCL",
    "c10d",
)


def _distributed() -> Any:
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available():
        return None
    return dist


def _unpin(group_type: type) -> int:
    """Reset default arguments in torch.distributed's modules that hold a process group."""
    reset = 0
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith("torch.distributed"):
            continue
        for value in list(vars(module).values()):
            # type(), not isinstance(): some values are deprecation proxies that warn
            if type(value) is not types.FunctionType:
                continue
            defaults = value.__defaults__ or ()
            if any(type(d) is group_type for d in defaults):
                value.__defaults__ = tuple(None if type(d) is group_type else d for d in defaults)
                reset += 1
            keywords = value.__kwdefaults__ or {}
            if any(type(d) is group_type for d in keywords.values()):
                value.__kwdefaults__ = {
                    k: None if type(d) is group_type else d for k, d in keywords.items()
                }
                reset += 1
    return reset


def teardown_process_groups() -> bool:
    """Destroy every process group of this process; False when there was none."""
    dist = _distributed()
    if dist is None or not dist.is_initialized():
        return False
    backend = str(dist.get_backend())
    _unpin(dist.ProcessGroup)
    gc.collect()
    if backend != "gloo":
        abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
        if abort is not None:
            abort()
    dist.destroy_process_group()
    gc.collect()
    return True


def _peers_checkpoint_failure(error: BaseException) -> bool:
    """A ``torch.distributed.checkpoint`` save or load that failed on other ranks only
    (its ``failures`` map rank to error, and this rank is not in it): a peer left the
    collective, for example a rank restarted in-process mid-save."""
    failures = getattr(error, "failures", None)
    if type(error).__name__ != "CheckpointException" or not isinstance(failures, dict):
        return False
    try:
        rank = int(os.environ.get("RANK", ""))
    except ValueError:
        return False
    return bool(failures) and rank not in failures


def is_collective_failure(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it) looks like a collective whose peer left."""
    dist = _distributed()
    dist_error = getattr(dist, "DistError", None) if dist is not None else None
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(dist_error, type) and isinstance(current, dist_error):
            return True
        if _peers_checkpoint_failure(current):
            return True
        if isinstance(current, RuntimeError):
            text = str(current)
            if any(word in text for word in _COLLECTIVE_WORDS):
                return True
        current = current.__cause__ or current.__context__
    return False
