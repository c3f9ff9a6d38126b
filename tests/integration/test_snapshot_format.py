"""The snapshot format (resurge.worker.snapshot_format) with real torch tensors: what goes in
comes back (dtypes, shapes, views, a module's state_dict metadata, RNG states), a file
rewritten in place with a smaller state holds only the new one, tensors read back own
their memory (a later snapshot over the same file cannot change them), and states the
format does not lay out raw still round-trip through torch.save.
"""

from __future__ import annotations

import pickle
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from resurge.worker import snapshot_format


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a, b)
        )
    if isinstance(a, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def test_a_state_round_trips_raw_and_its_file_is_reused(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(3, 8)).sum().backward()
    optimizer.step()
    state: dict[str, Any] = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "odd": {
            "bf16": torch.randn(3, 5).to(torch.bfloat16),
            "transposed": torch.randn(4, 6).t(),  # not contiguous
            "empty": torch.empty(0, 3),
            "flags": torch.tensor([True, False, True]),
            "scalar": torch.tensor(7, dtype=torch.int64),
        },
        "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
        "step": 12,
    }
    path = tmp_path / "snapshot"
    size = snapshot_format.write(path, state)

    assert path.read_bytes()[:8] == snapshot_format.MAGIC and path.stat().st_size == size
    back = snapshot_format.read(path)
    assert same(state, back)
    assert back["model"]._metadata == state["model"]._metadata  # module versions kept
    assert same(state, snapshot_format.read(path.read_bytes()))
    # Each tensor read back has a storage of its own: torch.set_rng_state reads a
    # tensor's storage from its start (a view at an offset in one shared buffer crashed).
    torch.set_rng_state(back["rng"]["torch"])
    drawn = torch.rand(4)
    torch.set_rng_state(state["rng"]["torch"])
    assert torch.equal(drawn, torch.rand(4))
    assert all(t.storage_offset() == 0 for t in back["model"].values())

    inode = path.stat().st_ino
    snapshot_format.write(path, {"step": 13, "w": torch.ones(2)})
    assert path.stat().st_ino == inode
    assert same(snapshot_format.read(path), {"step": 13, "w": torch.ones(2)})
    assert path.stat().st_size < size  # nothing of the bigger state left behind
    # What was read before is the reader's own: the rewrite did not reach it.
    assert same(back["optimizer"], state["optimizer"])


def test_a_state_with_a_sparse_tensor_is_written_with_torch_save(tmp_path: Path) -> None:
    state = {"sparse": torch.eye(3).to_sparse(), "dense": torch.arange(4.0)}
    snapshot_format.write(tmp_path / "snapshot", state)

    assert (tmp_path / "snapshot").read_bytes()[:8] != snapshot_format.MAGIC
    back = snapshot_format.read(tmp_path / "snapshot")
    assert torch.equal(back["sparse"].to_dense(), torch.eye(3))
    assert torch.equal(back["dense"], torch.arange(4.0))


def test_a_snapshot_of_another_format_version_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "snapshot"
    snapshot_format.write(path, {"w": torch.ones(1)})
    data = bytearray(path.read_bytes())
    length = int.from_bytes(data[8:16], "little")
    _, state, records = pickle.loads(data[16 : 16 + length])
    forged = pickle.dumps((99, state, records))
    data[8:16] = len(forged).to_bytes(8, "little")
    data[16 : 16 + length] = forged
    with pytest.raises(ValueError, match="format 99"):
        snapshot_format.read(bytes(data))
