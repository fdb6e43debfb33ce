"""Codec choices: how every chunk is compressed and checksummed, and which codecs a store may never use."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from zarr.codecs import BloscCodec, Crc32cCodec

from ..errors import OptionError

_SHUFFLES = ("bitshuffle", "shuffle", "noshuffle")
_CNAMES = ("zstd", "lz4", "lz4hc", "blosclz", "zlib")
_FAST = ("lz4", "blosclz")  # the codecs chosen for their decoding speed: `raw_above` applies to them
RAW_SAVING = 1 / 8  # a fast codec's frame that saves less than this share of a chunk is stored raw (`raw_above`)
_FRAME_BYTES = 16  # the most a Blosc frame adds to a chunk's bytes
# codecs and data types that unpickle or evaluate stored bytes: refused in every store outcore opens
_UNSAFE = re.compile(r"pickle|object|vlen-|json2|msgpack", re.IGNORECASE)


@dataclass(frozen=True)
class Compression:
    """Blosc settings of every chunk: ``Compression.parse("zstd:3:bitshuffle")``.

    The default, lz4 at level 5 with byte shuffling, was chosen by ``python benchmarks/codecs.py``:
    on photographs it decodes several times faster than lz4 or zstd with bit shuffling, which store them
    only a little smaller (lossless codecs gain little on photos). Decoding is what a training loop waits
    on; where the disk is the bottleneck, choose ``zstd:3:bitshuffle`` (docs/format.md has the table).
    With lz4 or blosclz, a chunk they shrink by less than `RAW_SAVING` is stored in a raw Blosc frame where
    outcore writes whole shard files (`raw_above`; not an encoded field's files): reading it is a copy, not a
    decompression.

    >>> str(Compression.parse("zstd"))
    'zstd:5:shuffle'
    """

    cname: str = "lz4"
    clevel: int = 5
    shuffle: str = "shuffle"

    def __post_init__(self) -> None:
        if self.cname not in _CNAMES + ("none",):
            raise OptionError(f"compression {self.cname!r} is not one of {_CNAMES + ('none',)}")
        if not 0 <= self.clevel <= 9:
            raise OptionError(f"compression level {self.clevel} is not between 0 and 9")
        if self.shuffle not in _SHUFFLES:
            raise OptionError(f"shuffle {self.shuffle!r} is not one of {_SHUFFLES}")

    @classmethod
    def parse(cls, value: str | Compression | None) -> Compression:
        """Read ``"CNAME[:LEVEL[:SHUFFLE]]"`` (or ``"none"``); ``None`` gives the default."""
        if value is None:
            return cls()
        if isinstance(value, Compression):
            return value
        parts = str(value).split(":")
        if len(parts) > 3:
            raise OptionError(f"compression {value!r} is not of the form CNAME[:LEVEL[:SHUFFLE]]")
        try:
            level = int(parts[1]) if len(parts) > 1 else cls.clevel
        except ValueError:
            raise OptionError(f"compression level {parts[1]!r} in {value!r} is not an integer") from None
        return cls(parts[0], level, parts[2] if len(parts) > 2 else cls.shuffle)

    def codecs(self) -> list[Any]:
        """The bytes-to-bytes codecs of each chunk: Blosc (unless ``none``), then a crc32c checksum."""
        if self.cname == "none":
            return [Crc32cCodec()]
        return [BloscCodec(cname=self.cname, clevel=self.clevel, shuffle=self.shuffle), Crc32cCodec()]

    def __str__(self) -> str:
        return "none" if self.cname == "none" else f"{self.cname}:{self.clevel}:{self.shuffle}"


def raw_above(cname: str, nbytes: int, files: bool = False) -> int:
    """The most bytes a Blosc frame of a chunk of ``nbytes`` compressed by ``cname`` may have and stay compressed:
    a frame of more is made again at level 0, a copy of the chunk's bytes (numcodecs, zarr and every Blosc reader
    read either). A fast codec's (lz4, blosclz) frame must save `RAW_SAVING` of the chunk: photographs' pixels
    barely compress, and lz4 decompresses them at about half the speed of a copy (docs/benchmarks.md, "Chunks
    that barely compress stored raw"); the other codecs were chosen to store fewer bytes, and keep every byte saved,
    as do the bytes of an encoded field's files (``files``: lz4 shrinks small JPEGs, their headers alike, by about a
    tenth, and reading them is a small part of decoding them).

    >>> raw_above("lz4", 8000), raw_above("zstd", 8000), raw_above("lz4", 8000, files=True)
    (7000, 8016, 8016)
    """
    return nbytes - int(nbytes * RAW_SAVING) if cname in _FAST and not files else nbytes + _FRAME_BYTES


def unsafe_codecs(metadata: Mapping[str, Any]) -> str | None:
    """What, in an array's raw JSON metadata (v3 ``zarr.json`` or v2 ``.zarray``), would unpickle or
    evaluate stored bytes; ``None`` when nothing would.

    >>> unsafe_codecs({"data_type": "uint8", "codecs": [{"name": "bytes"}, {"name": "numcodecs.pickle"}]})
    'codecs bytes numcodecs.pickle, data type uint8'
    """
    names = " ".join(_codec_names(metadata))
    data_type = str(metadata.get("data_type", metadata.get("dtype", "")))
    if _UNSAFE.search(names) or _UNSAFE.search(data_type) or data_type in ("|O", "string"):
        return f"codecs {names}, data type {data_type}"
    return None


def _codec_names(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key in ("name", "id"):
            if isinstance(node.get(key), str):
                yield node[key]
        for key, value in node.items():
            if key in ("codecs", "compressor", "filters", "configuration", "index_codecs", "serializer"):
                yield from _codec_names(value)
    elif isinstance(node, list):
        for item in node:
            yield from _codec_names(item)
