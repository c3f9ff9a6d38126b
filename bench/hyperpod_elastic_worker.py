"""The DDP example as a HyperPod elastic-training user writes it, without resurge.

    python bench/hyperpod_elastic_worker.py examples/ddp/train.py [train.py's flags]

Runs ``examples/ddp/train.py`` as a plain script (``import resurge`` fails, so it uses its
no-op stand-in and resumes from the newest complete checkpoint in ``--checkpoint-dir``,
as under torchrun) with the change HyperPod's elastic-training guide asks of a custom
script ("Training code modification", docs.aws.amazon.com/sagemaker/latest/dg/
sagemaker-eks-elastic-training.html): check for the elastic event after every step
(HyperPod's ``elastic_event_detected()``: a SIGUSR1 its agent sends to the training
processes), and when it came, save a DCP checkpoint and return, so that the operator
restarts the job at the new world size from that checkpoint.

Here SIGUSR1 sets a flag that the script's per-step ``checkpoint_requested()`` poll
returns; the script carries it in the step's loss all-reduce, so every rank saves at the
same step (``dcp.save`` is collective) once any rank saw the signal, the coordination
HyperPod's agent does by broadcasting the event to the ranks. After that checkpoint is
saved the worker leaves the training loop, destroys its process group and exits 0.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import signal
import sys
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

ELASTIC_SIGNAL = signal.SIGUSR1
_event = False


def _on_elastic_event(signum: int, frame: FrameType | None) -> None:
    global _event
    _event = True


class ElasticExit(Exception):
    """Raised once the checkpoint of an elastic event is saved: leaves the training loop."""

    def __init__(self, step: int) -> None:
        super().__init__(f"elastic event: checkpoint saved at step {step}")
        self.step = step


def load_script(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("ddp_train", path)
    assert spec is not None and spec.loader is not None, f"cannot load {path}"
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def main(argv: list[str]) -> int:
    signal.signal(ELASTIC_SIGNAL, _on_elastic_event)  # before torch's slow import
    sys.modules["resurge"] = None  # type: ignore[assignment]  # the script's stand-in
    os.environ.pop("RESURGE_GENERATION", None)
    script, args = Path(argv[0]), argv[1:]
    sys.argv = [str(script), *args]
    train = load_script(script)
    base: Any = getattr(train, "_NoOpRun")  # noqa: B009

    class ElasticRun(base):  # type: ignore[misc]
        def checkpoint_requested(self) -> bool:
            return _event

        def checkpoint_saved(self, step: int, path: str) -> None:
            if _event:
                raise ElasticExit(step)

    setattr(train, "_NoOpRun", ElasticRun)  # noqa: B010  # what main() instantiates
    try:
        return int(train.main(args))
    except ElasticExit as done:
        print(f"{done}; exiting for the restart at the new size", flush=True)
    import torch.distributed as dist

    gc.collect()  # the DDP wrapper first, as train.py does before destroying the group
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
