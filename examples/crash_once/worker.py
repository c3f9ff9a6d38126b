"""A worker with no torch that fails once: exit 1 in generation 0, exit 0 afterwards.

Only the rank named by CRASH_RANK (default 0) fails; every rank reads torchrun's RANK and
resurge's RESURGE_GENERATION, as an unmodified torchrun script would read its variables.
"""

import os
import sys

rank = int(os.environ["RANK"])
generation = int(os.environ["RESURGE_GENERATION"])
crash_rank = int(os.environ.get("CRASH_RANK", "0"))
print(f"rank {rank} of {os.environ['WORLD_SIZE']}, generation {generation}", flush=True)
if generation == 0 and rank == crash_rank:
    print(f"rank {rank}: failing on purpose in generation 0", file=sys.stderr, flush=True)
    sys.exit(1)
print(f"rank {rank}: done", flush=True)
