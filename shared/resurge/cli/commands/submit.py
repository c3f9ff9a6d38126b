"""``resurge submit FILE``: submit a TrainingJob; a bad spec is refused, naming the
field, before any cluster is looked for. On a Kubernetes cluster (``RESURGE_CLUSTER=
kubernetes``) it is refused, saying to ``kubectl apply`` it: there a job is a
TrainingJob, whose pods it owns."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from resurge.cli.connect import on_cluster

if TYPE_CHECKING:
    from resurge.jobspec import TrainingJob
    from resurge.runtime.bus import Bus
    from resurge.runtime.settings import Settings

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    """Register ``submit``."""
    submit = commands.add_parser("submit", help="submit a TrainingJob YAML file")
    submit.add_argument("file", type=Path)
    submit.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Check the file, then submit it; the exit status."""
    from resurge.jobspec import JobSpecError, load_job

    try:
        load_job(args.file)
    except (JobSpecError, OSError) as error:
        print(f"resurge submit: {error}", file=sys.stderr)
        return 2

    async def submit(settings: Settings, local: bool) -> int:
        if settings.cluster == "kubernetes":
            print(
                "resurge submit: on Kubernetes a job is a TrainingJob resource: "
                f"kubectl apply -f {args.file}",
                file=sys.stderr,
            )
            return 2
        return await _submit(args.file, settings, local=local)

    return on_cluster(args, submit, role="admin")


async def _submit(file: Path, settings: Settings, *, local: bool) -> int:
    from resurge.control.effects.client import SubmitRefused, connected, submit_job
    from resurge.jobspec import JobSpecError, load_job

    try:
        job = load_job(file)
    except (JobSpecError, OSError) as error:
        print(f"resurge submit: {error}", file=sys.stderr)
        return 2
    if local and job.spec.working_dir is None:
        # On a local cluster a relative path in the command means "from here".
        job = job.model_copy(
            update={"spec": job.spec.model_copy(update={"working_dir": str(Path.cwd())})}
        )
    async with connected(settings) as bus:
        try:
            outcome = await submit_job(bus, job)
        except SubmitRefused as error:
            print(f"resurge submit: {error}", file=sys.stderr)
            return 1
        never = await _cannot_hold(bus, job) if outcome == "created" else None
    print(f"trainingjob {job.name} {'submitted' if outcome == 'created' else outcome}")
    if never is not None:
        print(f"resurge submit: warning: {job.name} stays Pending: {never}", file=sys.stderr)
    return 0


async def _cannot_hold(bus: Bus, job: TrainingJob) -> str | None:
    """Why no node of the cluster (every node it knows, reporting or not: a node powered
    off may come back) could hold ``job`` (:func:`cannot_hold`), or None; also None when
    the nodes cannot be read: the job is submitted all the same."""
    from resurge.cluster import open_backend
    from resurge.control.decisions.admission import cannot_hold

    try:
        nodes = await (await open_backend(bus, bus.settings)).list_nodes()
    except Exception:  # a warning only: the status of the job says it too
        return None
    return cannot_hold(job, nodes, local=bus.settings.cluster == "local")
