"""The bytes of one snapshot: its tensors laid out raw, everything else pickled.

A snapshot is written every step, so its write must cost little more than copying its
tensors. ``torch.save`` pickles each storage and computes a CRC32 of every byte (measured:
96 ms for 100 MB on this project's CPU machines, against 15 ms for the copy itself).
This format instead pickles the state with each tensor replaced by its index, lays the
tensors' bytes out after that header, 64-byte aligned, and copies them straight into a
shared mapping of the file. A file being recycled (see
:meth:`resurge.worker.snapshot_folder.SnapshotFolder.write`) keeps its memory pages, so
a snapshot of the same state writes into pages that already exist.

Layout: ``MAGIC`` (8 bytes), the header's length (8 bytes, little-endian), the header
(pickle of ``(version, state with tensors as persistent ids, tensor records)``, each
record ``(dtype name, shape, offset from the data start, byte count)``), zero padding
to a multiple of :data:`ALIGN`, then the tensors' bytes.

Strided tensors of any dtype and device are written raw (a GPU tensor is copied straight
into the file); a snapshot holding any other tensor (sparse, quantized, nested) is
written with ``torch.save`` instead, and :func:`read` takes either. Reading gives every
tensor a storage of torch's own, read into from the file (never a mapping of it: a later
snapshot overwrites the file in place).

Unpickling runs the job's own code: a snapshot is read only from the job's worker
group's private folder, or as sent by its own ranks (with the generation's token).

torch is imported only when a function needs it.
"""

from __future__ import annotations

import io
import mmap
import os
import pickle
import struct
from pathlib import Path
from typing import Any

__all__ = ["ALIGN", "MAGIC", "Laid", "read", "write"]

MAGIC = b"RSNAP\x00\x00\x01"
ALIGN = 64
_VERSION = 1
_PREAMBLE = struct.Struct("<8sQ")


class _Unsupported(Exception):
    """A tensor this format does not lay out raw."""


class Laid:
    """A state laid out for writing: its file's ``size`` known before anything is written
    (a budget can refuse it first); :meth:`write` writes it."""

    def __init__(self, state: Any) -> None:
        import torch

        self._torch = torch
        self._tensors: list[Any] = []
        self._saved: bytes | None = None
        try:
            header_state = _pickle(state, self._tensors, torch)
        except _Unsupported:
            out = io.BytesIO()
            torch.save(state, out)
            self._saved = out.getvalue()
            self.size = len(self._saved)
            return
        self._records: list[tuple[str, tuple[int, ...], int, int]] = []
        offset = 0
        for tensor in self._tensors:
            nbytes = tensor.numel() * tensor.element_size()
            dtype = str(tensor.dtype).removeprefix("torch.")
            self._records.append((dtype, tuple(tensor.shape), offset, nbytes))
            offset += _aligned(nbytes)
        header = pickle.dumps(
            (_VERSION, header_state, self._records), protocol=pickle.HIGHEST_PROTOCOL
        )
        self._head = _PREAMBLE.pack(MAGIC, len(header)) + header
        self._start = _aligned(len(self._head))
        self.size = self._start + offset

    def write(self, path: str | os.PathLike[str]) -> int:
        """Write to ``path`` (created, or overwritten where it exists, its pages reused);
        the file's size."""
        if self._saved is not None:
            Path(path).write_bytes(self._saved)
            return self.size
        with Path(path).open("ab") as file:  # created if absent, never truncated first
            file.truncate(self.size)
        mapped = _mapped(path, self.size, self._torch)
        _fill(mapped, self._head, self._start, self._tensors, self._records, self._torch)
        return self.size  # unmapped now: the file holds it all


def write(path: str | os.PathLike[str], state: Any) -> int:
    """Write ``state`` to ``path`` (see :meth:`Laid.write`); the file's size."""
    return Laid(state).write(path)


def _fill(
    mapped: Any, head: bytes, start: int, tensors: list[Any], records: list[Any], torch: Any
) -> None:
    """Copy the header and every tensor into the mapped file (the views die with it)."""
    mapped[: len(head)].copy_(torch.frombuffer(bytearray(head), dtype=torch.uint8))
    for tensor, (_, _, at, nbytes) in zip(tensors, records, strict=True):
        if nbytes:
            target = mapped[start + at : start + at + nbytes].view(tensor.dtype)
            target.view(tensor.shape).copy_(tensor.detach())


def read(source: str | os.PathLike[str] | bytes | bytearray | memoryview) -> Any:
    """The state a snapshot holds, from its file or its bytes (either format)."""
    import torch

    if isinstance(source, (bytes, bytearray, memoryview)):
        return _read_from(memoryview(source), torch)
    with Path(source).open("rb") as file:
        head = file.read(_PREAMBLE.size)
        if head[: len(MAGIC)] != MAGIC:
            return torch.load(io.BytesIO(head + file.read()), weights_only=False)
        _, length = _PREAMBLE.unpack(head)
        version, header_state, records = pickle.loads(file.read(length))
        start = _aligned(_PREAMBLE.size + length)

        def fill(tensor: Any, at: int) -> None:
            file.seek(start + at)
            file.readinto(memoryview(_bytes_of(tensor).numpy()))

        return _rebuild(version, header_state, records, fill, torch)


def _read_from(buffer: memoryview, torch: Any) -> Any:
    if buffer.readonly:  # torch reads only from writable buffers
        buffer = memoryview(bytearray(buffer))
    if bytes(buffer[: len(MAGIC)]) != MAGIC:
        return torch.load(io.BytesIO(buffer), weights_only=False)
    _, length = _PREAMBLE.unpack_from(buffer)
    version, header_state, records = pickle.loads(buffer[_PREAMBLE.size : _PREAMBLE.size + length])
    start = _aligned(_PREAMBLE.size + length)
    data = torch.frombuffer(buffer, dtype=torch.uint8)

    def fill(tensor: Any, at: int) -> None:
        target = _bytes_of(tensor)
        target.copy_(data[start + at : start + at + target.numel()])

    return _rebuild(version, header_state, records, fill, torch)


def _rebuild(version: int, header_state: bytes, records: list[Any], fill: Any, torch: Any) -> Any:
    """The state, each tensor a storage of torch's own, filled by ``fill(tensor, offset)``.

    Not tensors over the reader's buffer: their storage's deleter would need the GIL,
    which a thread of torch's that frees one while the interpreter exits cannot take
    (the process aborts), and some readers of a tensor ignore its offset in a shared
    storage (torch.set_rng_state does)."""
    if version != _VERSION:
        raise ValueError(f"a snapshot of format {version}; this resurge reads {_VERSION}")
    tensors = []
    for dtype_name, shape, at, nbytes in records:
        tensor = torch.empty(shape, dtype=getattr(torch, dtype_name))
        if nbytes:
            fill(tensor, at)
        tensors.append(tensor)
    return _Unpickler(io.BytesIO(header_state), tensors).load()


def _bytes_of(tensor: Any) -> Any:
    """A contiguous tensor's bytes, as a flat uint8 tensor over the same storage."""
    import torch

    return tensor.view(-1).view(torch.uint8)


def _pickle(state: Any, tensors: list[Any], torch: Any) -> bytes:
    """``state`` pickled with each tensor an index into ``tensors`` (appended)."""
    out = io.BytesIO()
    _Pickler(out, tensors, torch).dump(state)
    return out.getvalue()


class _Pickler(pickle.Pickler):
    def __init__(self, out: io.BytesIO, tensors: list[Any], torch: Any) -> None:
        super().__init__(out, protocol=pickle.HIGHEST_PROTOCOL)
        self.tensors = tensors
        self.torch = torch

    def persistent_id(self, obj: Any) -> Any:
        torch = self.torch
        if not isinstance(obj, torch.Tensor):
            return None
        if (
            type(obj) not in (torch.Tensor, torch.nn.Parameter)
            or obj.layout != torch.strided
            or obj.is_quantized
            or obj.is_nested
            or obj.device.type == "meta"
        ):
            raise _Unsupported(type(obj))
        self.tensors.append(obj)
        return len(self.tensors) - 1


class _Unpickler(pickle.Unpickler):
    def __init__(self, source: io.BytesIO, tensors: list[Any]) -> None:
        super().__init__(source)
        self.tensors = tensors

    def persistent_load(self, pid: Any) -> Any:
        return self.tensors[int(pid)]


def _mapped(path: str | os.PathLike[str], size: int, torch: Any) -> Any:
    """The file's ``size`` bytes as a uint8 tensor over a shared mapping, its page table
    filled at once (one kernel call rather than a fault a page)."""
    with Path(path).open("r+b") as file:
        region = mmap.mmap(
            file.fileno(), size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        )
    return torch.frombuffer(region, dtype=torch.uint8)  # unmapped with the tensor


def _aligned(size: int) -> int:
    return -(-size // ALIGN) * ALIGN
