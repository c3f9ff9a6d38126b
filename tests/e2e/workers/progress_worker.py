"""A test worker with no torch that reports progress through resurge.worker.

Options shape its behaviour per generation, so one script serves several tests:
``--steps N --step-seconds S``; ``--slow-rank R --slow-factor F`` makes rank R's steps F
times longer (in every generation); ``--log-at STEP --log-line TEXT`` prints TEXT once
at that step (generation 0 only); ``--loss-spike-at STEP`` reports a huge loss there in
generation 0; ``--losses VALUES`` reports comma-separated losses, one per step, in
generation 0; ``--print-every N`` prints ``step N`` lines; ``--no-step-metric`` leaves
``step_seconds`` out, so step times come from the progress intervals.
"""

import argparse
import os
import sys
import time

from resurge import worker


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--step-seconds", type=float, default=0.05)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--slow-factor", type=float, default=1.0)
    parser.add_argument("--log-at", type=int, default=-1)
    parser.add_argument("--log-line", default="")
    parser.add_argument("--losses", default="")
    parser.add_argument("--print-every", type=int, default=0, help="print 'step N' every N steps")
    parser.add_argument(
        "--no-step-metric", action="store_true", help="do not report step_seconds with progress"
    )
    args = parser.parse_args()
    run = worker.connect()
    rank = int(os.environ["RANK"])
    first_generation = run.generation == 0
    losses = [float(x) for x in args.losses.split(",") if x] if first_generation else []
    pause = args.step_seconds * (args.slow_factor if rank == args.slow_rank else 1.0)
    for step in range(1, args.steps + 1):
        time.sleep(pause)
        if first_generation and step == args.log_at:
            print(args.log_line, flush=True)
        loss = losses[step - 1] if step <= len(losses) else 1.0
        if args.no_step_metric:
            run.progress(step, loss=loss)
        else:
            run.progress(step, loss=loss, step_seconds=pause)
        if args.print_every and step % args.print_every == 0:
            print(f"step {step} loss {loss}", flush=True)
    print(f"rank {rank} done", flush=True)
    run.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
