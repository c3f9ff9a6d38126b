"""A test worker with no torch that saves a checkpoint when resurge asks for one.

It steps every ``--step-seconds`` until stopped, reporting progress. When
``run.checkpoint_requested()`` is true it writes ``DIR/step-<N>/rank-<R>`` and reports
it with ``run.checkpoint_saved``. It opts in to ``checkpoint_signal=SIGUSR1`` with a
handler that prints ``SIGUSR1 at step <N>``. ``--plain-rank L``: local rank L never
imports resurge (a plain torchrun script); it prints ``plain ready`` and steps.
"""

import argparse
import os
import signal
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint-dir", type=Path, required=True)
    parser.add_argument("--step-seconds", type=float, default=0.05)
    parser.add_argument("--plain-rank", type=int, default=-1)
    args = parser.parse_args()
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    if local_rank == args.plain_rank:
        print("plain ready", flush=True)
        while True:
            time.sleep(args.step_seconds)

    from resurge import worker

    step = 0

    def on_usr1(_signum: int, _frame: object) -> None:
        os.write(1, f"SIGUSR1 at step {step}\n".encode())  # print is not reentrant

    signal.signal(signal.SIGUSR1, on_usr1)
    run = worker.connect(checkpoint_signal=signal.SIGUSR1)
    while True:
        step += 1
        time.sleep(args.step_seconds)
        run.progress(step, loss=1.0 / step)
        if run.checkpoint_requested():
            path = args.checkpoint_dir / f"step-{step}"
            path.mkdir(parents=True, exist_ok=True)
            (path / f"rank-{rank}").write_text(f"{step}\n")
            print(f"saved step {step} ({run.checkpoint_reason})", flush=True)
            run.checkpoint_saved(step, path)


if __name__ == "__main__":
    sys.exit(main())
