"""Where record files are: on this machine or in an object store (``s3://``, ``gs://``, ``az://``,
``https://``). Lists them (a folder, a glob, a brace list ``shard-{000000..000099}.tar``, an object
prefix), reads them as a stream, and reads byte ranges of them, through one client or file per process.

Object stores are read with the same client (obstore) and settings (``storage_options`` or the standard
environment) as stores are (`outcore.storage.remote`); nothing is copied to the local disk.
"""

from __future__ import annotations

import fnmatch
import glob
import io
import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, BinaryIO
from urllib.parse import urlsplit

from ...errors import SourceError
from ...storage.remote import is_object_url, object_store_client, redact

_BRACES = re.compile(r"\{([^{}]*)\}")
_handles: dict[tuple[int, str], Any] = {}  # (process id, what) -> an obstore client, an LMDB environment, ...
_handles_lock = threading.Lock()


def expand_braces(pattern: str) -> list[str]:
    """Every name a brace pattern stands for: ``{a,b}`` alternatives and ``{000..099}`` ranges (their
    width kept), as webdataset and the shell write them.

    >>> expand_braces("shard-{00..02}.tar")
    ['shard-00.tar', 'shard-01.tar', 'shard-02.tar']
    >>> expand_braces("{train,val}-{0..1}")
    ['train-0', 'train-1', 'val-0', 'val-1']
    """
    found = _BRACES.search(pattern)
    if found is None:
        return [pattern]
    inside = found.group(1)
    span = re.fullmatch(r"(-?\d+)\.\.(-?\d+)", inside)
    if span:
        first, last = int(span.group(1)), int(span.group(2))
        width = len(span.group(1)) if span.group(1).startswith("0") else 0
        step = 1 if last >= first else -1
        choices = [str(n).zfill(width) for n in range(first, last + step, step)]
    else:
        choices = inside.split(",")
    head, tail = pattern[: found.start()], pattern[found.end() :]
    return [name for choice in choices for name in expand_braces(head + choice + tail)]


def list_files(source: str | os.PathLike | Sequence[str | os.PathLike], suffixes: Sequence[str],
               storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """The files ``source`` names, sorted: a file, a folder (its files ending in ``suffixes``, below it),
    a glob or brace pattern, a list of these, or the same in an object store (a prefix is listed).

    >>> list_files("shards/train-{0..1}.tar", (".tar",))  # doctest: +SKIP
    ['shards/train-0.tar', 'shards/train-1.tar']
    """
    if not isinstance(source, str | os.PathLike):
        return [name for item in source for name in list_files(item, suffixes, storage_options)]
    source = os.fspath(source)
    names = [found for pattern in expand_braces(source) for found in _matches(pattern, suffixes, storage_options)]
    if not names:
        raise SourceError(f"no {'/'.join(suffixes) or 'record'} files found at {redact(source)!r}")
    return names


def _matches(pattern: str, suffixes: Sequence[str], storage_options: Mapping[str, Any] | None) -> list[str]:
    if is_object_url(pattern):
        return _remote_matches(pattern, suffixes, storage_options or {})
    if os.path.isdir(pattern):
        return sorted(os.path.join(folder, name) for folder, subfolders, files in os.walk(pattern)
                      for name in files if name.endswith(tuple(suffixes)) and not name.startswith("."))
    if glob.has_magic(pattern):
        return sorted(glob.glob(pattern))
    if not os.path.exists(pattern):
        raise SourceError(f"{pattern!r} does not exist")
    return [pattern]


def _remote_matches(url: str, suffixes: Sequence[str], options: Mapping[str, Any]) -> list[str]:

    root, key = split_url(url)
    named = key.endswith(tuple(suffix for suffix in suffixes if suffix)) and not glob.has_magic(key)
    if urlsplit(url).scheme in ("http", "https") or named:
        return [url]  # plain HTTP cannot be listed: files are named one by one (or by a brace list)
    if glob.has_magic(key):  # a glob: the objects of its folder whose names match it
        folder = key[: min(key.index(c) for c in "*?[" if c in key)].rpartition("/")[0]
        listed = list_objects(f"{root}/{folder}" if folder else root, ("",), options)
        return [found for found, _, _ in listed if fnmatch.fnmatchcase(found[len(root) + 1 :], key)]
    return [found for found, _, _ in list_objects(url, suffixes, options)]


def list_objects(url: str, suffixes: Sequence[str],
                 storage_options: Mapping[str, Any] | None = None) -> list[tuple[str, int, int]]:
    """``(url, size, modification time in ns)`` of each object under the prefix ``url`` whose name ends in
    one of ``suffixes`` (any case), sorted; hidden names (a part starting with ``.``) left out."""
    import obstore

    root, key = split_url(url)
    prefix = key.rstrip("/") + "/" if key else None
    lowered = tuple(suffix.lower() for suffix in suffixes)
    found = []
    for batch in _remote_call(url, lambda: obstore.list(_bucket(root, storage_options or {}), prefix=prefix)):
        for meta in batch:
            name = meta["path"]
            if name.lower().endswith(lowered) and not any(part.startswith(".") for part in name.split("/")):
                modified = meta.get("last_modified")
                found.append((f"{root}/{name}", int(meta["size"]),
                              int(modified.timestamp() * 1e9) if modified is not None else 0))
    return sorted(found)


def split_url(url: str) -> tuple[str, str]:
    """``("s3://bucket", "path/to/file")`` of an object URL."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}", parts.path.lstrip("/")


def _bucket(root: str, options: Mapping[str, Any]) -> Any:
    return per_process(f"bucket {root}", lambda: object_store_client(root, options))


def per_process(what: str, make: Callable[[], Any]) -> Any:
    """This process's one ``what`` (an object store client, an LMDB environment, ...), made the first time;
    a forked child makes its own."""
    key = (os.getpid(), what)
    with _handles_lock:
        found = _handles.get(key)
        if found is None:
            found = _handles[key] = make()
    return found


def read_exactly(stream: BinaryIO, count: int) -> bytes:
    """``count`` bytes of ``stream``, or fewer at its end (however its reads come back)."""
    data = stream.read(count)
    while len(data) < count:
        more = stream.read(count - len(data))
        if not more:
            break
        data += more
    return data


def file_version(location: str, storage_options: Mapping[str, Any] | None = None) -> tuple[int, int]:
    """``(size, modification time in ns)`` of a file or object (what tells a changed source apart)."""
    if is_object_url(location):
        import obstore

        root, key = split_url(location)
        meta = _remote_call(location, lambda: obstore.head(_bucket(root, storage_options or {}), key))
        modified = meta.get("last_modified")
        return int(meta["size"]), int(modified.timestamp() * 1e9) if modified is not None else 0
    stat = os.stat(location)
    return stat.st_size, stat.st_mtime_ns


def read_range(location: str, offset: int, length: int, storage_options: Mapping[str, Any] | None = None) -> bytes:
    """Bytes ``offset .. offset + length - 1`` of a file or object; fewer is an `OSError` (a short file)."""
    if is_object_url(location):
        import obstore

        root, key = split_url(location)
        data = bytes(_remote_call(location, lambda: obstore.get_range(
            _bucket(root, storage_options or {}), key, start=offset, length=length)))
    else:
        descriptor = os.open(location, os.O_RDONLY)  # per read: no descriptor kept (a thousand files, a deleted one)
        try:
            data = os.pread(descriptor, length, offset)
        finally:
            os.close(descriptor)
    if len(data) != length:
        raise OSError(f"{length} bytes at offset {offset} were asked for and {len(data)} are there (a short file)")
    return data


def read_file(location: str, storage_options: Mapping[str, Any] | None = None) -> bytes:
    """The whole file or object."""
    if not is_object_url(location):
        with open(location, "rb") as file:
            return file.read()
    import obstore

    root, key = split_url(location)
    return bytes(_remote_call(location, lambda: obstore.get(_bucket(root, storage_options or {}), key).bytes()))


def open_stream(location: str, storage_options: Mapping[str, Any] | None = None) -> BinaryIO:
    """The file or object, read from its start (an object in pieces as they arrive: memory stays small)."""
    if not is_object_url(location):
        return open(location, "rb")
    import obstore

    root, key = split_url(location)
    result = _remote_call(location, lambda: obstore.get(_bucket(root, storage_options or {}), key))
    return pieces_stream(iter(result.stream(min_chunk_size=4 * 2**20)))


def pieces_stream(pieces: Iterator[Any], buffer_size: int = 4 * 2**20) -> BinaryIO:
    """A buffered stream reading the byte pieces an iterator gives, in order."""
    return io.BufferedReader(_Pieces(pieces), buffer_size=buffer_size)  # type: ignore[return-value]


class _Pieces(io.RawIOBase):
    """A readable raw stream over an iterator of byte pieces."""

    def __init__(self, pieces: Iterator[Any]) -> None:
        self._pieces, self._left = pieces, memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._left:
            piece = next(self._pieces, None)
            if piece is None:
                return 0
            self._left = memoryview(bytes(piece))
        count = min(len(buffer), len(self._left))
        buffer[:count] = self._left[:count]
        self._left = self._left[count:]
        return count


def _remote_call(location: str, call: Any) -> Any:
    try:
        return call()
    except FileNotFoundError:
        raise SourceError(f"{redact(location)} does not exist") from None
    except Exception as error:  # obstore's errors share no base class  # noqa: BLE001
        raise OSError(f"cannot read {redact(location)}: {type(error).__name__}: {error}") from None


def shown(location: str, root: str) -> str:
    """A file's name as the store records it: relative to the source's ``root``."""
    if is_object_url(location):
        return location[len(root) :].lstrip("/") if location.startswith(root) else location
    return os.path.relpath(location, root) if root else os.path.basename(location)


def common_root(locations: Sequence[str]) -> str:
    """The folder (or object prefix) all ``locations`` are under."""
    if len(locations) == 1:
        return locations[0].rpartition("/")[0]
    prefix = os.path.commonprefix(list(locations))
    return prefix.rpartition("/")[0]
