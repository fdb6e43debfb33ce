"""PyTorch: the parts of a batch that DataLoader workers write into shared memory, gathered into pinned memory by
the DataLoader's pin thread, not by the training loop's thread.

With ``pin_memory=True``, a DataLoader's pin thread takes each item its workers hand over and pins it, while the
training loop runs. A worker's part of a batch (`outcore.iterate.shared.Part`) is only its rows of the batch's
files: the loader could pin the batch only once every part had come, on the training loop's thread, as it
handed the batch over (a copy of the whole batch, and the files' mappings, in the loop's time). Instead the pin
thread copies each part's rows from the files into the batch's own pinned memory as the part comes
(`PinnedParts.copy`, the copy made with the GIL released), and hands the file back to the workers once every row
is copied; the loader then takes the batch's pinned arrays as they are (`PinnedParts.take`).

>>> import tempfile
>>> from outcore.iterate.shared import Arena, Part, Slot
>>> folder = tempfile.mkdtemp(dir="/dev/shm")
>>> arenas = [Slot(folder).arena(Part("batch", offset, 4)) for offset in (0, 2)]  # two workers' parts of 4 rows
>>> made = [arena.publish({"x": np.full((2, 100_000), offset, np.uint8)}) for arena, offset in zip(arenas, (0, 1))]
>>> pinned = PinnedParts(allocate=lambda shape, dtype, field="": np.empty(shape, dtype))  # a test's "pinned" memory
>>> copied = [pinned.copy(part, folder, offset, 2) for part, offset in zip(made, (0, 2))]
>>> fields, rest = pinned.take(copied, [2, 2])
>>> fields["x"][:, 0].tolist(), rest
([0, 0, 1, 1], [SharedBatch(fields={}, no_room=False), SharedBatch(fields={}, no_room=False)])
>>> sorted(path.name for path in Path(folder).iterdir())  # the file, its rows all copied: free for the next batch
['free-400016-batch-x']
>>> import shutil; shutil.rmtree(folder)
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ClusterError
from ..iterate.gather import Empty
from ..iterate.shared import SharedArray, SharedBatch, free_file, mapped_file


@dataclass(frozen=True)
class PinnedArray:
    """A field of a batch whose parts the pin thread copies into pinned memory: that memory is the batch's
    entry ``key`` (the mailbox's folder, the file's name) of `PinnedParts`."""

    key: tuple[str, str]


class PinnedParts:
    """The pinned memory of the batches whose parts have come (some or all), by folder and file name, until the
    loader takes them; ``allocate`` makes a batch's array of a field (`outcore.adapters.torch_batches.pinned_empty`)."""

    def __init__(self, allocate: Empty) -> None:
        self.allocate = allocate
        self.lock = threading.Lock()
        self.batches: dict[tuple[str, str], tuple[np.ndarray, list[int]]] = {}  # key -> array, [rows copied]

    def copy(self, made: SharedBatch, folder: str, offset: int, size: int) -> SharedBatch:
        """A worker's part ``made`` of a batch (its ``size`` rows from row ``offset`` of the batch's files in
        ``folder``) copied into the batch's pinned arrays; each file whose every row is now copied is handed
        back for another batch. The part's other fields (small arrays, in the part itself) stay as they are."""
        fields: dict[str, SharedArray | PinnedArray | np.ndarray] = {}
        for name, value in made.fields.items():
            if not isinstance(value, SharedArray):
                fields[name] = value
                continue
            key, dtype, rows = (folder, value.name), np.dtype(value.dtype), value.shape[0]
            if not 0 <= offset < offset + size <= rows:
                raise ClusterError(f"a worker's part of a batch (rows {offset} to {offset + size}) is not within "
                                   f"its file {value.name}'s {rows} rows")
            source = mapped_file(Path(folder), value)[0].reshape(value.shape)
            with self.lock:  # the batch's first part to come makes its pinned array
                if key not in self.batches:
                    self.batches[key] = (self.allocate(value.shape, dtype, name), [0])
                pinned, copied = self.batches[key]
            np.copyto(pinned[offset : offset + size], source[offset : offset + size])  # outside the GIL
            with self.lock:
                copied[0] += size
                whole = copied[0] == rows
            if whole:
                free_file(Path(folder), value.name, value.file_size)
            fields[name] = PinnedArray(key)
        return SharedBatch(fields, made.no_room)

    def take(self, parts: Sequence[SharedBatch], sizes: Sequence[int]) -> tuple[dict[str, np.ndarray], list[SharedBatch]]:
        """The pinned arrays of the batch whose ``parts`` (of ``sizes`` rows, in order; each as `copy` gave it) have
        all come, by field, and the parts without those fields (to be joined as they are). A part that a worker
        sent as arrays (it found no room in shared memory) is copied in here."""
        pinned = {name: value for part in parts for name, value in part.fields.items() if isinstance(value, PinnedArray)}
        offsets = np.cumsum([0, *sizes]).tolist()
        fields = {}
        for name, value in pinned.items():
            with self.lock:
                array, copied = self.batches.pop(value.key, (None, [0]))
            rows = copied[0]
            for part, offset, size in zip(parts, offsets[:-1], sizes, strict=True):
                piece = part.fields.get(name)
                if isinstance(piece, PinnedArray) and piece == value:
                    continue
                if isinstance(piece, np.ndarray) and array is not None and piece.shape == (size, *array.shape[1:]):
                    array[offset : offset + size] = piece
                    rows += size
                else:
                    raise ClusterError(f"the parts of a batch disagree on field {name!r}: "
                                       f"{[part.fields.get(name) for part in parts]}")
            if array is None or rows != len(array):
                raise ClusterError(f"the parts of a batch hold {rows} rows of field {name!r}, not its "
                                   f"{sum(sizes) if array is None else len(array)}: a worker's part of it is missing")
            fields[name] = array
        rest = [SharedBatch({name: value for name, value in part.fields.items() if name not in pinned}, part.no_room)
                for part in parts]
        return fields, rest

    def drop(self, folder: str, keep: str | None = None) -> None:
        """Let go of the batches of ``folder`` not taken (a pass stopped early), but for those whose file's name
        starts with ``keep`` (the current pass's)."""
        with self.lock:
            for key in [key for key in self.batches if key[0] == folder and not (keep and key[1].startswith(keep))]:
                del self.batches[key]
