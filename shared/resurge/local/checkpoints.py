"""What ``resurge delete JOB`` does with the job's checkpoints on a local cluster.

A job whose spec names no ``checkpoint.dir`` checkpoints into a folder resurge chose for
it, ``checkpoints/<job>`` in the state folder: deleting the job removes that folder (as
deleting a Kubernetes Job removes its pods' scratch space), so a job submitted again
under its name is a new run that starts fresh instead of resuming the deleted one. A
folder the spec names is the user's (a volume of theirs, in Kubernetes terms): it is
kept, and delete says where it is. Workers still stopping may write into the folder
after it was removed (a save on SIGTERM); delete a running job's leftovers by hand then.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from resurge.control.state.records import JobRecord
from resurge.worker.environment import default_checkpoint_dir

__all__ = ["forget_checkpoints"]


def forget_checkpoints(record: JobRecord, state_dir: Path) -> str:
    """Remove ``record``'s default checkpoint folder, or keep the one its spec names;
    what was done, in words."""
    named = record.spec.spec.checkpoint.dir
    if named:
        return f"checkpoints in {named} kept (spec.checkpoint.dir is the job's own folder)"
    folder = Path(default_checkpoint_dir(record.name, state_dir))
    if not folder.exists():
        return ""
    shutil.rmtree(folder, ignore_errors=True)
    return f"checkpoints in {folder} removed"
