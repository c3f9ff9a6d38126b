"""Protected state: snapshots in the node's memory, and a resume from peers instead of the disk.

A script registers what must survive a fault, after it joined its process group::

    state = run.protect(model=ddp, optimizer=optimizer)   # anything with state_dict()
    step = state.restore()      # collective: the step to go on after, or None
    if step is None:            # nothing live: the disk checkpoint, as before
        step = load_disk_checkpoint_if_any()
    for step in range(step + 1, steps + 1):
        ...
        optimizer.step()
        state.snapshot(step)    # every step by default; returns at once

The contract:

- ``snapshot(step)`` (every ``RESURGE_SNAPSHOT_INTERVAL_STEPS`` steps, the job's
  ``spec.checkpoint.memoryIntervalSteps``, default 1) writes each registered object's
  ``state_dict()``, the step, and the RNG states (torch's, Python's, numpy's if imported)
  to the node's snapshot folder (:mod:`resurge.worker.snapshot_folder`). Tensors the
  registered optimizers change in place (the parameters they step and their own state)
  are written in a background thread straight from memory, and each optimizer's next
  ``step()`` waits until that write is done (a step pre-hook), so a snapshot is never
  torn and costs the training loop only what the write does not overlap; every other
  tensor (buffers, which a forward pass changes) is copied before ``snapshot`` returns.
  With no optimizer registered, the whole write happens before it returns.
- Replicated state (``sharded=False``, the default: DDP, every rank holds it all) is
  written once per node (by local rank 0); every rank keeps its own random generators
  beside it (``rng-<rank>-of-<world>``), and takes them back where its node kept them; a
  rank on a new node, or at another world size, takes the copy's writer's (the same
  stream where every rank seeds and draws alike, as most scripts do).
  Sharded state (``sharded=True``: FSDP's sharded state dicts, ZeRO) is written by every
  rank, as shard ``rank`` of ``world_size``.
- ``restore()`` is collective: every rank of the generation calls it once, after
  ``init_process_group`` (without a process group it is a world of one). The ranks
  gather what each can read on its node and agree on one step
  (:func:`resurge.worker.live_copy.plan`: the newest step whose state is complete among
  them, never a mix); each loads its state from its own node's memory or receives it from
  the rank that holds it, over a gloo group (the default one when it is gloo), and the
  registered objects get it through ``load_state_dict``. Snapshots of later steps are
  dropped from the node's memory (a resume from the disk drops those after its step): a
  later restore never picks a step of a run that did not go on. It returns that step; None
  when nothing complete is live (then, as before: ``run.resume_checkpoint``, else a
  fresh start). Each rank tells its agent where its state came from (the ``restored``
  line: ``memory``, ``peer``, ``disk`` or ``start``), which the job's status shows.
- What it costs is measured as it goes: :attr:`ProtectedState.costs`
  (:class:`SnapshotCosts`: the time ``snapshot`` held the loop, the write's time and
  size, and all the time the loop waited for writes).
- A script that never calls ``protect`` runs as before, and so does one run without an
  agent (no ``RESURGE_SNAPSHOT_DIR``): ``snapshot`` does nothing and ``restore`` returns None.
- A snapshot's tensors are written raw and the rest pickled
  (:mod:`resurge.worker.snapshot_format`), and read back by unpickling: the files are the
  job's own, in its worker group's private folder, or sent by its own ranks.

torch is imported only when a method needs it.
"""

from __future__ import annotations

import atexit
import os
import random
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from resurge.worker import snapshot_format
from resurge.worker.buddy import Buddy, BuddyServer, buddy_of, new_token, reachable_host, send_copy
from resurge.worker.environment import read_environment
from resurge.worker.live_copy import REPLICATED, Held, RestorePlan, plan, shard_key
from resurge.worker.snapshot_folder import SnapshotFolder
from resurge.worker.wire import restored_line

if TYPE_CHECKING:
    from resurge.worker import WorkerRun

__all__ = [
    "ProtectedState",
    "Restored",
    "SnapshotCosts",
    "Stateful",
    "rng_key",
    "rng_state",
    "set_rng_state",
]

FORMAT = 1


class Stateful(Protocol):
    """What may be registered: a model, an optimizer, a scheduler, a data sampler..."""

    def state_dict(self) -> Any:
        """The object's state, to snapshot."""

    def load_state_dict(self, state: Any, /) -> Any:
        """Take ``state`` back."""


@dataclass
class SnapshotCosts:
    """What snapshots cost this rank, as measured: the last snapshot's ``call_seconds``
    (the time :meth:`ProtectedState.snapshot` held the training loop: its copies of the
    unguarded tensors), ``write_seconds`` (its write, in the background where an optimizer
    is registered) and ``bytes``; ``waited_seconds``, all the time the training loop
    waited for writes in flight (an optimizer's step, the next snapshot), and ``skipped``,
    the snapshots not kept (memory full, or past the budget), since the start. A script
    may report them with its progress."""

    call_seconds: float = 0.0
    write_seconds: float = 0.0
    bytes: int = 0
    waited_seconds: float = 0.0
    skipped: int = 0


@dataclass(frozen=True)
class Restored:
    """Where this rank's state came from: ``source`` as in the ``restored`` line."""

    step: int | None
    source: str
    detail: str


# Where this process takes its wards' copies of sharded state (one server a process: it
# outlives the generations of in-process restarts).
_server: BuddyServer | None = None

# The write still in flight, whichever ProtectedState started it (an in-process restart
# builds a new one while the old one's write may still run): restore() waits for it.
_in_flight: threading.Thread | None = None
_in_flight_lock = threading.Lock()


def _wait_in_flight() -> None:
    with _in_flight_lock:
        thread = _in_flight
    if thread is not None:
        thread.join()


# A process that exits with a write in flight lets it end first: a daemon thread stopped
# by the interpreter's exit inside torch's C++ code aborts the process.
atexit.register(_wait_in_flight)


class ProtectedState:
    """What a script registered with :meth:`resurge.worker.WorkerRun.protect`."""

    def __init__(
        self,
        run: WorkerRun | None,
        objects: Mapping[str, Stateful],
        *,
        sharded: bool = False,
        every: int | None = None,
        rng: bool = True,
    ) -> None:
        for name, value in objects.items():
            if not callable(getattr(value, "state_dict", None)) or not callable(
                getattr(value, "load_state_dict", None)
            ):
                raise ValueError(f"{name} has no state_dict() and load_state_dict(): {value!r}")
        if not objects:
            raise ValueError("protect() needs at least one object, as name=object")
        env = read_environment()
        if every is None:
            every = env.snapshot_interval_steps or 1
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a positive number of steps, not {every!r}")
        self.objects = dict(objects)
        self.sharded = sharded
        self.every = every
        self.rng = rng
        self.run = run
        self.folder = (
            SnapshotFolder(env.snapshot_dir, env.snapshot_budget_bytes)
            if env.snapshot_dir
            else None
        )
        self.restored: Restored | None = None
        self.buddy: Buddy | None = None  # where sharded snapshots are copied (restore)
        self.last_snapshot: int | None = None
        self.costs = SnapshotCosts()
        self._kept = True  # the last snapshot was kept (a skip after one is said)
        self._error: BaseException | None = None
        self._hooked: list[Any] = []
        for value in self.objects.values():
            hook = getattr(value, "register_step_pre_hook", None)
            if callable(hook):  # an optimizer: its next step waits for the write
                self._hooked.append(hook(lambda *_: self.wait()))

    # -- snapshots --

    def snapshot(self, step: int) -> bool:
        """Snapshot the registered state after ``step`` when it is due; True if one began."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be a non-negative int, not {step!r}")
        if self.folder is None or step % self.every:
            return False
        rank, world, local_rank = _place()
        self.wait()
        began = time.perf_counter()
        key = shard_key(rank, world) if self.sharded else REPLICATED
        # Replicated state once a node (local rank 0); each rank's random generators its own.
        payload = self._payload(step, rank, world) if self.sharded or local_rank == 0 else None
        generators = rng_state() if self.rng and not self.sharded else None
        buddy = self.buddy

        def write() -> None:
            self._write(step, rank, world, key, payload, generators, buddy)

        global _in_flight
        if self._hooked:
            thread = threading.Thread(target=write, name="resurge-snapshot", daemon=True)
            with _in_flight_lock:
                _in_flight = thread
            thread.start()
        else:
            write()
            self.wait()
        self.last_snapshot = step
        self.costs.call_seconds = time.perf_counter() - began
        return True

    def _write(
        self,
        step: int,
        rank: int,
        world: int,
        key: str,
        payload: dict[str, Any] | None,
        generators: dict[str, Any] | None,
        buddy: Buddy | None,
    ) -> None:
        """Write a snapshot's files (and send its buddy copy); an error other than a full
        memory is raised at the next :meth:`wait`."""
        assert self.folder is not None
        folder, costs = self.folder, self.costs
        started = time.perf_counter()
        try:
            if generators is not None:
                laid = snapshot_format.Laid(generators)
                folder.write(rng_key(rank, world), step, laid.write, laid.size)
            if payload is None:
                return
            laid = snapshot_format.Laid(payload)
            path = folder.write(key, step, laid.write, laid.size)
            costs.write_seconds = time.perf_counter() - started
            costs.bytes = laid.size
        except OSError as error:  # memory full: this step stays unprotected, training goes on
            costs.skipped += 1
            if costs.skipped == 1 or self._kept:  # said once a run of skipped ones
                print(
                    f"resurge.worker: the snapshot of step {step} was not kept: {error}",
                    file=sys.stderr,
                    flush=True,
                )
            self._kept = False
            return
        except BaseException as error:  # raised at the next wait, in the training thread
            self._error = error
            return
        self._kept = True
        if buddy is not None:  # within the write: the buddy holds step N before N + 1
            send_copy(buddy, key, step, path)

    def wait(self) -> None:
        """Return once the snapshot in flight is written; raise what writing it raised."""
        began = time.perf_counter()
        _wait_in_flight()
        self.costs.waited_seconds += time.perf_counter() - began
        error, self._error = self._error, None
        if error is not None:
            raise RuntimeError(f"resurge.worker: writing a snapshot failed: {error}") from error

    def _payload(self, step: int, rank: int, world: int) -> dict[str, Any]:
        """The snapshot of ``step``: tensors the optimizers guard by reference, the
        rest copied now."""
        guarded = self._guarded()
        state = {
            name: _copy_unguarded(value.state_dict(), guarded)
            for name, value in self.objects.items()
        }
        return {
            "format": FORMAT,
            "step": step,
            "rank": rank,
            "world_size": world,
            "sharded": self.sharded,
            "state": state,
            "rng": rng_state() if self.rng else None,  # replicated: the writer's, a fallback
        }

    def _guarded(self) -> set[int]:
        """Storage addresses of the tensors the hooked optimizers change in place."""
        addresses: set[int] = set()
        for value in self.objects.values():
            if not callable(getattr(value, "register_step_pre_hook", None)):
                continue
            for group in getattr(value, "param_groups", []):
                for parameter in group.get("params", []):
                    addresses.add(_address(parameter))
            for per_parameter in getattr(value, "state", {}).values():
                for tensor in per_parameter.values():
                    if _is_tensor(tensor):
                        addresses.add(_address(tensor))
        return addresses

    # -- restore --

    def restore(self) -> int | None:
        """Load the newest complete live state (collective); the step it is of, or None."""
        _wait_in_flight()
        rank, world, _ = _place()
        if self.folder is not None:
            self.folder.sweep()  # what a rank killed mid-write left
        mine = self.folder.held() if self.folder is not None else []
        cuttable = self.sharded and self.reshardable()
        everyone, addresses, cuttable = _all_gather(mine, world, self._address(), cuttable)
        self.buddy = self._buddy(rank, world, addresses)
        disk_step = self.run.resume_step if self.run is not None else None
        decided = plan(everyone, self.sharded, disk_step, reshardable=cuttable)
        if decided.step is None:
            restored = self._fallback(decided)
        else:
            restored = self._load(decided, rank, world)
        self.restored = restored
        if self.folder is not None:  # snapshots past the resume point are a future undone
            self.folder.drop_after(restored.step)
        if self.run is not None:
            line = restored_line(
                self.run.generation,
                restored.step,
                restored.source,
                restored.detail,
                self.sharded,
                reshardable=cuttable,
            )
            self.run._send(line)
        return restored.step if restored.source in ("memory", "peer") else None

    def reshardable(self) -> bool:
        """Whether this sharded state can be cut again for another world size: every
        registered module's and optimizer's parameters are DTensors cut on their first
        dimension (FSDP2), at least one of them."""
        params = []
        for value in self.objects.values():
            parameters = getattr(value, "parameters", None)
            if callable(parameters):
                params += list(parameters())
            for group in getattr(value, "param_groups", None) or []:
                params += list(group.get("params", []))
        return bool(params) and all(_dim0_shard(p) for p in params)

    def _address(self) -> tuple[str, int, str] | None:
        """Where this rank takes its wards' copies, and a token for this generation's
        (sharded state under an agent only)."""
        if not self.sharded or self.folder is None:
            return None
        global _server
        if _server is None or _server.folder.root != self.folder.root:
            _server = BuddyServer(self.folder)
        master = os.environ.get("MASTER_ADDR") or "127.0.0.1"
        host = reachable_host(master, int(os.environ.get("MASTER_PORT") or 0))
        return host, _server.port, new_token()

    def _buddy(
        self, rank: int, world: int, addresses: list[tuple[str, int, str] | None]
    ) -> Buddy | None:
        """This rank's buddy for the generation, once every rank can take copies."""
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE") or 1)
        to = buddy_of(rank, world, local_world)
        known = [a for a in addresses if a is not None]
        if to is None or _server is None or len(known) < world:
            return None
        token = known[0][2]  # rank 0's: one token for the generation
        _server.accept_token(token)
        host, port, _ = known[to]
        return Buddy(rank=to, host=host, port=port, token=token)

    def _fallback(self, decided: RestorePlan) -> Restored:
        run = self.run
        if run is not None and run.resume_checkpoint is not None and run.resume_step is not None:
            detail = (
                f"no complete live copy ({decided.reason}): the disk checkpoint of step "
                f"{run.resume_step}"
            )
            return Restored(run.resume_step, "disk", detail)
        return Restored(None, "start", f"nothing to resume from ({decided.reason})")

    def _load(self, decided: RestorePlan, rank: int, world: int) -> Restored:
        assert decided.step is not None
        pieces = decided.sources[rank]
        payloads = self._read_pieces(decided, pieces, _exchange(decided, rank, world, self.folder))
        moved = [giver for _, giver in pieces if giver is not None]
        source = "peer" if moved else "memory"
        detail = _detail(decided, len(pieces), moved)
        for payload in payloads:
            missing = sorted(set(self.objects) - set(payload["state"]))
            if missing:
                raise RuntimeError(
                    f"resurge.worker: the live snapshot of step {decided.step} has no "
                    f"{missing}: register the same names in every generation"
                )
        for name, value in self.objects.items():
            if decided.cut_from is None:
                state = payloads[0]["state"][name]
            else:
                state = _recut(value, [p["state"][name] for p in payloads], rank, world)
            value.load_state_dict(_as_registered(value, state))
        # Sharded: each rank's generators are in its own shard (re-cut: the old rank's).
        payload = payloads[rank] if 0 < rank < len(payloads) else payloads[0]
        own = None
        if self.rng and not self.sharded and self.folder is not None:
            kept = self.folder.path(rng_key(rank, world), decided.step)
            own = snapshot_format.read(kept) if kept.is_file() else None
        if self.rng and (own is not None or payload.get("rng") is not None):
            # This rank's own generators where its node kept them, else the holder's
            # (the same stream where every rank seeds and draws alike, as most do).
            set_rng_state(own if own is not None else payload["rng"])
        return Restored(decided.step, source, detail)

    def _read_pieces(
        self,
        decided: RestorePlan,
        pieces: list[tuple[str, int | None]],
        received: dict[int, memoryview],
    ) -> list[Any]:
        """Each piece's snapshot: from this node's memory, or as received."""
        assert decided.step is not None
        payloads = []
        for index, (key, giver) in enumerate(pieces):
            if giver is None:
                assert self.folder is not None
                payloads.append(snapshot_format.read(self.folder.path(key, decided.step)))
            else:
                payloads.append(snapshot_format.read(received[index]))
        return payloads

    def close(self) -> None:
        """Wait for the write in flight and unhook the optimizers."""
        self.wait()
        for handle in self._hooked:
            handle.remove()
        self._hooked.clear()


def _detail(decided: RestorePlan, pieces: int, moved: list[int]) -> str:
    """Where a rank's state came from, in words."""
    if decided.cut_from is not None:
        return (
            f"step {decided.step} re-cut from {decided.cut_from} shards ({len(moved)} "
            f"from peers, {pieces - len(moved)} in this node's memory)"
        )
    if moved:
        return f"step {decided.step} from rank {moved[0]}'s memory"
    return f"step {decided.step} from this node's memory"


def rng_key(rank: int, world: int) -> str:
    """The key of rank ``rank``'s random generators (replicated state: each rank keeps
    its own beside the node's one copy of the state)."""
    return f"rng-{rank}-of-{world}"


def _place() -> tuple[int, int, int]:
    """(rank, world size, local rank) of this process in its process group."""
    local_rank = int(os.environ.get("LOCAL_RANK") or 0)
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), local_rank
    return 0, 1, local_rank


def _all_gather(
    mine: list[Held], world: int, address: tuple[str, int, str] | None, cuttable: bool
) -> tuple[list[list[Held]], list[tuple[str, int, str] | None], bool]:
    """Every rank's snapshots and buddy address (see :meth:`ProtectedState._address`),
    and whether every rank's state can be cut again."""
    if world == 1:
        return [mine], [address], cuttable
    import torch.distributed as dist

    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, ([(h.key, h.step) for h in mine], address, cuttable))
    held = [[Held(key, step) for key, step in snapshots] for snapshots, _, _ in gathered]
    addresses = [None if a is None else (str(a[0]), int(a[1]), str(a[2])) for _, a, _ in gathered]
    return held, addresses, all(bool(c) for _, _, c in gathered)


def _exchange(
    decided: RestorePlan, rank: int, world: int, folder: SnapshotFolder | None
) -> dict[int, memoryview]:
    """Send the copies this rank gives and receive those it needs, over a gloo group:
    what it received, by its index among the rank's pieces. Every rank takes part when
    any copy moves; a piece travels tagged with its index among its receiver's."""
    moving = [giver for pieces in decided.sources.values() for _, giver in pieces]
    if world == 1 or all(giver is None for giver in moving):
        return {}
    import torch
    import torch.distributed as dist

    group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
    assert decided.step is not None
    sends = [
        (key, to, [k for k, _ in decided.sources[to]].index(key)) for key, to in decided.sends(rank)
    ]
    data: dict[str, Any] = {}
    for key, _, _ in sends:
        if key not in data:
            assert folder is not None
            data[key] = torch.frombuffer(
                _read_all(folder.path(key, decided.step)), dtype=torch.uint8
            )
    wanted = {
        index: giver for index, (_, giver) in enumerate(decided.sources[rank]) if giver is not None
    }
    sizes = {index: torch.zeros(1, dtype=torch.int64) for index in wanted}
    _transfer(
        [(torch.tensor([data[key].numel()], dtype=torch.int64), to, tag) for key, to, tag in sends],
        [(sizes[index], giver, index) for index, giver in wanted.items()],
        group,
    )
    received = {index: torch.empty(int(sizes[index][0]), dtype=torch.uint8) for index in wanted}
    _transfer(
        [(data[key], to, tag) for key, to, tag in sends],
        [(received[index], giver, index) for index, giver in wanted.items()],
        group,
    )
    if group is not None:
        dist.destroy_process_group(group)
    return {index: memoryview(tensor.numpy().data) for index, tensor in received.items()}


def _read_all(path: Path) -> bytearray:
    """The file's bytes, read once into a buffer of their own."""
    with path.open("rb") as file:
        data = bytearray(os.fstat(file.fileno()).st_size)
        file.readinto(data)
    return data


def _transfer(
    outgoing: list[tuple[Any, int, int]], incoming: list[tuple[Any, int, int]], group: Any
) -> None:
    """Each (tensor, peer, tag) of ``outgoing`` sent and of ``incoming`` received, at once."""
    import torch.distributed as dist

    works = [dist.isend(tensor, to, group=group, tag=tag) for tensor, to, tag in outgoing]
    works += [dist.irecv(tensor, giver, group=group, tag=tag) for tensor, giver, tag in incoming]
    for work in works:
        if work is not None:
            work.wait()


def _is_tensor(value: object) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _address(tensor: Any) -> int:
    return int(_local(tensor).untyped_storage().data_ptr())


def _local(tensor: Any) -> Any:
    """A DTensor's local shard (FSDP2's parameters and their optimizer state); any other
    tensor as it is."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) and hasattr(tensor, "device_mesh") else tensor


def _like(loaded: Any, template: Any) -> Any:
    """``loaded`` (a plain tensor from a snapshot) as a DTensor sharded as ``template``
    is, when ``template`` is one of the same local shape; else ``loaded``."""
    if not (_is_tensor(loaded) and hasattr(template, "device_mesh")):
        return loaded
    if tuple(loaded.shape) != tuple(_local(template).shape):
        return loaded
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(
        loaded.to(template.device),
        template.device_mesh,
        template.placements,
        run_check=False,
        shape=template.shape,
        stride=template.stride(),
    )


def _dim0_shard(tensor: Any) -> bool:
    """Whether ``tensor`` is a DTensor cut on its first dimension over a 1-D mesh (as
    FSDP2 cuts parameters and their optimizer state): what a re-cut can cut again."""
    placements = getattr(tensor, "placements", None)
    mesh = getattr(tensor, "device_mesh", None)
    return (
        mesh is not None
        and mesh.ndim == 1
        and placements is not None
        and len(placements) == 1
        and placements[0].is_shard(0)
    )


def _cut(template: Any, pieces: list[Any], rank: int, world: int) -> Any:
    """Rank ``rank``'s part, of ``world``, of the tensor whose old shards are ``pieces``
    (in their ranks' order), where ``template`` (the registered tensor now) is cut on its
    first dimension and they add up to it; else the first piece (state kept alike on
    every rank: a step count, a learning rate)."""
    if not (_dim0_shard(template) and all(_is_tensor(p) and p.dim() >= 1 for p in pieces)):
        return pieces[0]
    import torch

    whole = torch.cat(pieces, dim=0)
    if whole.shape[0] != template.shape[0]:
        return pieces[0]
    parts = torch.chunk(whole, world, dim=0)  # how FSDP2 and Shard(0) cut
    return (parts[rank] if rank < len(parts) else whole[:0]).clone()


def _recut(value: Any, states: list[Any], rank: int, world: int) -> Any:
    """``value``'s state (a module or an optimizer as registered now) for rank ``rank``
    of ``world``, from the old ranks' ``states`` in order; any other object's from the
    first."""
    return _per_tensor(value, states, lambda template, pieces: _cut(template, pieces, rank, world))


def _as_registered(value: Any, state: Any) -> Any:
    """``state`` from a snapshot, its shards made DTensors again where ``value`` (a module
    or an optimizer as registered now) holds DTensors."""
    return _per_tensor(value, [state], lambda template, pieces: _like(pieces[0], template))


def _per_tensor(value: Any, states: list[Any], take: Any) -> Any:
    """The state to load into ``value`` from ``states`` (one state dict of each rank
    that wrote one, alike in their keys): a module's each entry, an optimizer's each
    per-parameter entry, ``take(registered tensor now or None, [that entry of each])``;
    anything else the first state as it is."""
    first = states[0]
    if callable(getattr(value, "named_parameters", None)) and isinstance(first, dict):
        current = value.state_dict()
        rebuilt = type(first)(
            (key, take(current.get(key), [s[key] for s in states])) for key in first
        )
        metadata = getattr(first, "_metadata", None)  # a module state_dict's versions
        if metadata is not None:
            rebuilt._metadata = metadata  # type: ignore[attr-defined]
        return rebuilt
    groups = getattr(value, "param_groups", None)
    if isinstance(groups, list) and isinstance(first, dict) and "state" in first:
        params = [p for group in groups for p in group.get("params", [])]
        per_param = {}
        for index, entry in first["state"].items():
            template = params[index] if isinstance(index, int) and index < len(params) else None
            per_param[index] = {
                key: take(template, [s["state"][index][key] for s in states]) for key in entry
            }
        return {**first, "state": per_param}
    return first


def _copy_unguarded(value: Any, guarded: set[int]) -> Any:
    """``value`` with every tensor outside ``guarded`` copied (so later in-place changes
    do not reach the snapshot), containers rebuilt, the rest kept."""
    if _is_tensor(value):
        tensor = _local(value).detach()  # a DTensor's own shard: rebuilt as one on load
        return tensor if _address(tensor) in guarded else tensor.clone()
    if isinstance(value, dict):
        copied = {name: _copy_unguarded(item, guarded) for name, item in value.items()}
        if isinstance(value, OrderedDict):
            copied = OrderedDict(copied)
            metadata = getattr(value, "_metadata", None)  # a module state_dict's versions
            if metadata is not None:
                copied._metadata = metadata  # type: ignore[attr-defined]
        return copied
    if isinstance(value, list):
        return [_copy_unguarded(item, guarded) for item in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_copy_unguarded(item, guarded) for item in value)
    return value


def rng_state() -> dict[str, Any]:
    """This process's random generators' states: torch's, Python's, numpy's (if imported)
    and CUDA's (if initialized)."""
    import torch

    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        state["numpy"] = numpy.random.get_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Set the random generators back to ``state`` (from :func:`rng_state`)."""
    import torch

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    numpy = sys.modules.get("numpy")
    if numpy is not None and "numpy" in state:
        numpy.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
