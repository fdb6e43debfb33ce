"""What a scan finds in one record file (a *part*), and how each sample is named and read back.

A sample of a record source is read back by a *reference*, a string naming the file and the record:

- ``FILE::WHAT @OFFSET+LENGTH``: the picture's bytes lie at that range of the file (TFRecord, tar);
- ``FILE::WHAT #INDEX``: the file cannot be read at a place (GZIP, Parquet pages, a function of the
  user's): its pictures are unpacked while it is scanned (`outcore.ingest.records.spill`), read there;
- ``FILE::key b'...'``: an LMDB value;
- ``FILE::WHAT (damaged: WHY)``: a record that cannot be read, named in the error or the skip report.

``WHAT`` says which record it is (``record 17``, ``row 17``, a tar member's name).

>>> parse("train.tfrecord::record 3 @1024+500")
Reference(file='train.tfrecord', what='record 3', span=(1024, 500), index=None, key=None, damage=None)
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ...errors import SourceError
from .spill import Spill

_AT = re.compile(r"^(?P<what>.*) @(?P<offset>\d+)\+(?P<length>\d+)$")
_INDEX = re.compile(r"^(?P<what>.*) #(?P<index>\d+)$")
_DAMAGE = re.compile(r"^(?P<what>.*) \(damaged: (?P<why>.*)\)$", re.DOTALL)
_KEY = re.compile(r"^key (?P<key>b(['\"]).*\2)$", re.DOTALL)
SEPARATOR = "::"


@dataclass(frozen=True)
class Reference:
    """A parsed reference (see the module docstring); ``file`` alone for a plain file."""

    file: str
    what: str = ""
    span: tuple[int, int] | None = None
    index: int | None = None
    key: bytes | None = None
    damage: str | None = None

    @property
    def name(self) -> str:
        """``FILE::WHAT``: what messages call the sample."""
        return f"{self.file}{SEPARATOR}{self.what}" if self.what else self.file


def parse(reference: str) -> Reference:
    """The parts of a sample's reference; a plain path or URL is a whole file."""
    file, separator, rest = reference.rpartition(SEPARATOR)
    if not separator:
        return Reference(reference)
    if (found := _DAMAGE.match(rest)) is not None:
        return Reference(file, found["what"], damage=found["why"])
    if (found := _AT.match(rest)) is not None:
        return Reference(file, found["what"], span=(int(found["offset"]), int(found["length"])))
    if (found := _INDEX.match(rest)) is not None:
        return Reference(file, found["what"], index=int(found["index"]))
    if (found := _KEY.match(rest)) is not None:
        return Reference(file, rest, key=ast.literal_eval(found["key"]))
    return Reference(reference)


@dataclass
class PartScan:
    """The records of one file, in order: for each, ``whats`` (which record), ``spans`` (offset and length
    of its picture in the file; offset -1 where the file cannot be read at a place), ``keys`` (LMDB),
    its ``labels`` (one list per label key, ``None`` where damaged) and ``damage`` (``""``, or why it
    cannot be read). ``version`` is the file's size and modification time."""

    location: str
    version: tuple[int, int]
    whats: list[str] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)
    labels: dict[str, list[Any]] = field(default_factory=dict)
    damage: list[str] = field(default_factory=list)
    keys: list[bytes] | None = None
    classes: dict[str, tuple[str, ...]] = field(default_factory=dict)  # names the file itself gives
    spill: Spill | None = field(default=None, repr=False)
    notes: set[str] = field(default_factory=set)  # what the user is warned of (a guess the scan made)

    def add(self, what: str, span: tuple[int, int], labels: dict[str, Any], damage: str = "",
            key: bytes | None = None, picture: bytes | None = None) -> None:
        """Record ``what``: its picture at ``span`` of the file, or, with offset -1, ``picture``'s bytes
        themselves, which go to the spill (the file cannot be read at a place)."""
        if self.spill is not None and span[0] < 0:
            self.spill.add(b"" if damage or picture is None else picture)
        self.whats.append(what)
        self.spans.append(span)
        self.damage.append(damage)
        if self.keys is not None:
            self.keys.append(key if key is not None else b"")
        for name in labels.keys() - self.labels.keys():
            self.labels[name] = [None] * (len(self.whats) - 1)
        for name, column in self.labels.items():
            column.append(labels.get(name))

    def finish(self) -> PartScan:
        """End the scan: the spilled pictures' offsets written, the spill closed."""
        if self.spill is not None:
            self.spill.close()
            self.spill = None
        return self

    def reference(self, i: int) -> str:
        """The reference of record ``i`` (see the module docstring)."""
        what = self.whats[i]
        if self.damage[i]:
            return f"{self.location}{SEPARATOR}{what} (damaged: {self.damage[i]})"
        if self.keys is not None:
            return f"{self.location}{SEPARATOR}key {self.keys[i]!r}"
        offset, length = self.spans[i]
        if offset < 0:
            return f"{self.location}{SEPARATOR}{what} #{i}"
        return f"{self.location}{SEPARATOR}{what} @{offset}+{length}"

    def __len__(self) -> int:
        return len(self.whats)


@contextmanager
def scanning(location: str, version: tuple[int, int], unpack_into: str | None, direct: bool,
             keys: list[bytes] | None = None) -> Iterator[PartScan]:
    """A `PartScan` of the file at ``location``; where it cannot be read at a place (not ``direct``), its
    pictures are spilled into the folder ``unpack_into`` as it is scanned (removed if the scan fails)."""
    if not direct and unpack_into is None:
        raise SourceError(f"{location} cannot be read at a place, and no folder was given to unpack it into")
    scan = PartScan(location, version, keys=keys, spill=None if direct else Spill(unpack_into, location))
    try:
        yield scan
    except BaseException:
        if scan.spill is not None:
            scan.spill.discard()
        raise
    scan.finish()
