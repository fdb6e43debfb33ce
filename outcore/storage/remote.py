"""Stores in object stores (``s3://``, ``gs://``, ``az://``, ``https://``), read through obstore.

A `RemoteStore` is a zarr store (zarr reads the metadata through it) that also reads byte ranges of
shard files for the direct shard reader (`RemoteFiles`): each shard file's size and version (ETag) are
asked once per process, then every range is read with ``If-Match`` on that version, so a store
rewritten remotely while it is read is an error (`StoreChangedError`), never old bytes mixed with
new ones; a store outcore published (`outcore.storage.upload`) also names its generation in each
object's metadata, and an answer of another generation than the group's ``zarr.json`` is that error
too (a shard replaced before this process first asked for it). A zip store (``.../train.zarr.zip``)
is read as ranges of its one object (`outcore.storage.remote_zip`). Ranges go through the node's
`ChunkCache` when one is given; a range not answered in time is asked again beside the first request
(`RemoteFiles._hedged`).

Settings come from ``storage_options`` (obstore's: ``endpoint``, ``region``, ``access_key_id``, ...,
``client_options={...}``) or the standard environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
...). They are kept out of every message and repr. The obstore client is made lazily in each process,
never shared across processes; obstore cannot run in a process forked after it was used, which gets a
clear `OptionError` instead of a hang (`FORKED_AFTER_USE`).

>>> store = RemoteStore("s3://bucket/train.zarr", {"region": "eu-west-1"})  # doctest: +SKIP
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from zarr.abc.store import OffsetByteRequest, RangeByteRequest, Store, SuffixByteRequest
from zarr.storage import ObjectStore

from ..errors import OptionError, RemoteError, StoreChangedError
from ..threads import chosen_io_threads, sharing, submit_request
from .cache import ChunkCache
from .pace import BYTES_AHEAD, Pace
from .remote_zip import RemoteZip
from .zipstore import byte_span

GENERATION = "outcore-generation"  # object metadata: the id of the run that wrote the object
SCHEMES = ("s3", "s3a", "gs", "gcs", "az", "azure", "abfs", "abfss", "adl", "http", "https")
ATTEMPTS = 5  # tries of one ranged read before it is an error
DEADLINE_SECONDS = 120.0  # the most one ranged read may take, its retries included
BACKOFF_SECONDS = 0.2  # the first retry's wait (doubling, with jitter)
REQUEST_HEDGE_SECONDS = 2.0  # a ranged read is never asked a second time sooner ...
REQUEST_HEDGE_FACTOR = 3.0  # ... nor before this many times the recent answers' time (their median)
HEDGE_SHARE = 0.05  # at most this share of the requests are asked twice
PREFETCHED = 1024  # ranges asked for and waiting to be read, at most, per store and process (see `Pace`)
COALESCED_BYTES = 8 * 2**20  # the most one request fetches for chunks stored back to back
CLIENT_DEFAULTS = {"timeout": "30s", "connect_timeout": "5s"}  # per request; storage_options may change them
_ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
FORKED_AFTER_USE = (
    "obstore, which reads object stores, cannot run in a process forked after it was used (its runtime's "
    "threads are not in the child, and its requests would hang): start DataLoader workers and other "
    "processes with multiprocessing_context='forkserver' or 'spawn' (ds.torch() does so by default for "
    "object stores)"
)
_used = False  # obstore was used in this process
_forked_after_use = False  # this process was forked from one that had used it


def is_object_url(location: str) -> bool:
    """Whether ``location`` names an object store outcore reads itself (``s3://``, ``gs://``, ...)."""
    return "://" in location and urlsplit(location).scheme.lower() in SCHEMES  # a path is not parsed


def redact(url: str) -> str:
    """``url`` without a user name, password or query (which may hold a signature)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


@dataclass
class Traffic:
    """What this process asked of the object store for one store: requests made (HEADs and ranged GETs,
    retries included; second requests for late answers counted apart) and bytes received."""

    requests: int = 0
    bytes: int = 0
    hedged: int = 0  # requests asked a second time, their first answer being late


@dataclass(frozen=True)
class Version:
    """What a shard file is: its size in bytes and its ETag (the object's version); for a member of a zip
    store, the zip ``object`` it lies in, at ``offset``, and the zip's ETag."""

    size: int
    etag: str
    object: str = ""
    offset: int = 0


class RemoteStore(ObjectStore):
    """The zarr store of a store in an object store, with outcore's ranged reads (`files`).

    Pickles as its URL, its settings and its cache; each process makes its own client when it first
    reads, and keeps the versions of the shard files it has seen (they travel with it when pickled, so
    DataLoader and Dask workers read the same version of the store as the process that opened it).
    """

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None, *,
                 cache: ChunkCache | None = None, read_only: bool = True) -> None:
        self.url = url.rstrip("/")
        self._options = dict(storage_options or {})
        self.cache = cache
        self.generation: str | None = None  # of the group's zarr.json, once read: every answer must match it
        self._client, self._pid = None, 0
        Store.__init__(self, read_only=read_only)  # not ObjectStore's, which wants a client now: made when used
        self.files = RemoteFiles(self)
        self.zip: RemoteZip | None = None  # a zip store: its members are ranges of one object
        self._client_url = self.url
        if urlsplit(self.url).path.endswith(".zip"):
            if not read_only:
                raise OptionError(f"{redact(self.url)}: zip stores are read-only; write a folder store")
            self._client_url, name = self.url.rsplit("/", 1)
            self.zip = RemoteZip(self.files, name, redact(self.url))

    @property  # type: ignore[override]
    def store(self) -> Any:
        """The obstore client of this process, made when first used (a process forked after obstore was used
        gets an `OptionError` instead: obstore's requests would hang there, see `FORKED_AFTER_USE`)."""
        if self._client is None or self._pid != os.getpid():
            self._client, self._pid = object_store_client(self._client_url, self._options), os.getpid()
        return self._client

    @store.setter
    def store(self, client: Any) -> None:
        self._client, self._pid = client, os.getpid()

    async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
        """zarr's reads (the metadata: a few small objects), through obstore's blocking calls, retried by
        obstore, then one `RemoteError` naming the object."""
        import obstore

        if self.zip is not None:
            return self._get_member(key, prototype, byte_range)
        options = {} if byte_range is None else {"range": _obstore_range(byte_range)}
        try:
            result = obstore.get(self.store, key, options=options)
            data = result.bytes()
        except FileNotFoundError:
            return None
        except Exception as error:  # noqa: BLE001 - obstore's errors share no base class with OSError
            raise self._translated("read", key, error) from None
        if key == "zarr.json" and self.generation is None:
            self.generation = result.attributes.get(GENERATION)
        self.files.check_generation(key, result.attributes)
        return prototype.buffer.from_bytes(data)

    def _get_member(self, key: str, prototype: Any, byte_range: Any) -> Any:
        """A member of a zip store (or a range of it), read as a range of the zip object."""
        try:
            version = self.files.version(key)
        except FileNotFoundError:
            return None
        start, stop = byte_span(byte_range, version.size)
        return prototype.buffer.from_bytes(bytes(self.files.read_object(key, start, stop - start, version)))

    async def exists(self, key: str) -> bool:
        import obstore

        if self.zip is not None:
            return key in self.zip.members()
        try:
            obstore.head(self.store, key)
            return True
        except FileNotFoundError:
            return False
        except Exception as error:  # noqa: BLE001
            raise self._translated("look for", key, error) from None

    async def getsize(self, key: str) -> int:
        return self.files.size(key)

    def _translated(self, what: str, key: str, error: Exception) -> Exception:
        """An obstore error other than a missing object, as the `RemoteError` naming it; any other as it is."""
        if type(error).__module__.startswith("obstore") and not isinstance(error, FileNotFoundError):
            return self.files.failure(what, key, error)
        return error

    async def list(self) -> AsyncIterator[str]:
        async for key in self.list_prefix(""):
            yield key

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        if self.zip is None:
            async for key in super().list_prefix(prefix):
                yield key
            return
        for key in self.zip.members():
            if key.startswith(prefix):
                yield key

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        if self.zip is None:
            async for key in super().list_dir(prefix):
                yield key
            return
        start = prefix.rstrip("/") + "/" if prefix else ""
        for name in sorted({key[len(start):].split("/", 1)[0] for key in self.zip.members() if key.startswith(start)}):
            yield name

    def with_read_only(self, read_only: bool = False) -> RemoteStore:
        return RemoteStore(self.url, self._options, cache=self.cache, read_only=read_only)

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "options": self._options, "cache": self.cache, "read_only": self.read_only,
                "versions": self.files.versions(), "generation": self.generation,
                "zip": self.zip.known() if self.zip is not None else None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], state["options"], cache=state["cache"], read_only=state["read_only"])
        self.files.remember(state["versions"])
        self.generation = state["generation"]
        if self.zip is not None:
            self.zip.remember(state["zip"])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemoteStore) and (self.url, self._options) == (other.url, other._options)

    def __hash__(self) -> int:
        return hash(self.url)

    def __repr__(self) -> str:
        return f"RemoteStore({redact(self.url)!r})"

    __str__ = __repr__


class RemoteFiles:
    """The shard files of a `RemoteStore`, as the direct shard reader reads them: ``size(key)`` and
    ``read_into(key, offset, buffer)``, through the cache, each read retried within a bounded time."""

    def __init__(self, store: RemoteStore) -> None:
        self.remote = store
        self._versions: dict[str, Version] = {}
        self._lock = threading.Lock()
        self._fetched: OrderedDict[tuple[str, int, int], Future[memoryview]] = OrderedDict()
        self._unasked: OrderedDict[tuple[str, int, int], None] = OrderedDict()  # read before their prefetch came
        self.traffic = Traffic()
        self.pace = Pace()  # the measured request time and delivery rate: how far ahead to fetch
        self._spans: dict[str, tuple[int, int]] = {}  # per array: ranges asked for and their bytes

    def versions(self) -> dict[str, Version]:
        with self._lock:
            return dict(self._versions)

    def remember(self, versions: Mapping[str, Version]) -> None:
        with self._lock:
            self._versions.update(versions)

    def version(self, key: str) -> Version:
        """The file's size and ETag (and, in a zip store, where it lies in the zip), asked of the object store
        the first time only."""
        known = self._versions.get(key)
        if known is None:
            known = self._locate(key)
            with self._lock:
                known = self._versions.setdefault(key, known)
        return known

    def _locate(self, key: str) -> Version:
        zip_store = self.remote.zip
        if zip_store is not None and key != zip_store.name:
            container = self.version(zip_store.name)
            offset, size = zip_store.locate(key, container)
            return Version(size, container.etag, zip_store.name, offset)
        import obstore

        meta = self._call(key, "ask the size of", lambda: obstore.head(self.remote.store, key))
        return Version(int(meta["size"]), str(meta.get("e_tag") or meta.get("version") or ""))

    def read_object(self, key: str, offset: int, nbytes: int, version: Version) -> memoryview:
        """Bytes ``offset..offset + nbytes - 1`` of the file (fewer at its end), through the cache."""
        stop = min(version.size, offset + nbytes)
        return self._read(key, offset, stop, version) if stop > offset else memoryview(b"")

    def size(self, key: str) -> int:
        return self.version(key).size

    def fetch_ahead(self) -> int:
        """Slots (a chunk of every field) to fetch ahead of the reads: ``OUTCORE_IO_THREADS`` when set,
        else as many as hide the measured latency (`outcore.storage.pace.Pace.ahead`), within this
        process's part of `BYTES_AHEAD` (the DataLoader workers of one loader share it)."""
        chosen = chosen_io_threads()
        if chosen is not None:
            return chosen
        with self._lock:
            slot_bytes = sum(total / count for count, total in self._spans.values())
        return self.pace.ahead(slot_bytes, budget=BYTES_AHEAD // sharing())

    def ask(self, key: str, spans: Sequence[tuple[int, int]]) -> Callable[[], None] | None:
        """Say that byte ranges of the file will be read (``(offset, nbytes)``, stored back to back, see
        `coalesce`); return the work that fetches them, one request a run of back-to-back ranges (None:
        nothing to fetch; those on the local disk or already asked for are left out). From now on a
        `read_into` of one of them waits for that work instead of asking the object store itself. At most
        `PREFETCHED` ranges wait to be read; older ones are dropped (a run that stopped early)."""
        version = self.version(key)
        cache = self.remote.cache
        wanted: dict[int, tuple[int, int, Future[memoryview]]] = {}
        array = key.rsplit("/c/", 1)[0]
        with self._lock:
            count, total = self._spans.get(array, (0, 0))
            self._spans[array] = (count + len(spans), total + sum(nbytes for _, nbytes in spans))
        for offset, nbytes in spans:
            start, stop = offset, min(version.size, offset + nbytes)
            if cache is not None and cache.holds(self._name(key, start, stop, version)):
                continue  # on the local disk: the read reads it there, straight into its buffer
            future: Future[memoryview] = Future()
            with self._lock:
                if (key, start, stop) in self._fetched:
                    continue
                if (key, start, stop) in self._unasked:  # its read came first and fetched it: nothing to do
                    del self._unasked[(key, start, stop)]
                    continue
                self._fetched[(key, start, stop)] = future
                while len(self._fetched) > PREFETCHED:
                    self._fetched.popitem(last=False)
            wanted[start] = (start, stop, future)
        if not wanted:
            return None
        runs = coalesce([(start, stop - start) for start, stop, _ in wanted.values()], limit=None)
        return lambda: [self._fetch_run(key, version, [wanted[offset] for offset, _ in run]) for run in runs]

    def _fetch_run(self, key: str, version: Version, run: list[tuple[int, int, Future[memoryview]]]) -> None:
        """Fetch ranges stored back to back with one request (each kept in the cache by itself). The ranges after
        the one that fetches them are offered to the cache before that one is kept: a process waiting for that
        one then finds them kept (or being fetched), and never fetches them again."""
        joined: list[memoryview] = []
        cache = self.remote.cache

        def whole(after: int) -> memoryview:
            if not joined:
                joined.append(self._get(key, run[0][0], run[-1][1], version))
                for start, stop, _ in run[after + 1 :] if cache is not None else ():
                    cache.offer(self._name(key, start, stop, version),
                                joined[0][start - run[0][0] : stop - run[0][0]])
            return joined[0]

        for number, (start, stop, future) in enumerate(run):
            try:
                begin = start - run[0][0]
                fetch = (lambda begin=begin, end=begin + stop - start, number=number: whole(number)[begin:end])
                data = cache.get_or_fetch(self._name(key, start, stop, version), stop - start, fetch) \
                    if cache is not None else fetch()
                future.set_result(data)
            except BaseException as error:  # noqa: BLE001 - the read that asks for these bytes raises it
                future.set_exception(error)

    def expect(self, key: str, offset: int, nbytes: int, when: float) -> None:
        """Tell the cache when these bytes of the file will be read next (`ChunkCache.expect`)."""
        cache = self.remote.cache
        if cache is not None:
            version = self.version(key)
            cache.expect(self._name(key, offset, min(version.size, offset + nbytes), version), when)

    def read_into(self, key: str, offset: int, buffer: memoryview) -> int:
        """Fill ``buffer`` with the file's bytes from ``offset``."""
        version = self.version(key)
        start, stop = offset, min(version.size, offset + len(buffer))
        if stop <= start:
            return 0
        with self._lock:
            fetched = self._fetched.pop((key, start, stop), None)
            if fetched is None:
                self._unasked[(key, start, stop)] = None
                while len(self._unasked) > 4 * PREFETCHED:
                    self._unasked.popitem(last=False)
        if fetched is None:
            return len(self._read(key, start, stop, version, buffer))
        data = fetched.result()
        buffer[: len(data)] = data
        return len(data)

    def _read(self, key: str, start: int, stop: int, version: Version, out: memoryview | None = None) -> memoryview:
        """Bytes ``start..stop - 1`` of the file, through the cache when there is one (into ``out`` when
        given)."""
        cache = self.remote.cache
        if cache is not None:
            return cache.get_or_fetch(self._name(key, start, stop, version), stop - start,
                                      lambda: self._get(key, start, stop, version), out)
        data = self._get(key, start, stop, version)
        if out is None:
            return data
        out[: len(data)] = data
        return out[: len(data)]

    def _name(self, key: str, start: int, stop: int, version: Version) -> str:
        """The cache's name of a byte range of one version of a file, in one generation of the store."""
        generation = f"#{self.remote.generation}" if self.remote.generation else ""
        return f"{self.remote.url}/{key}@{version.etag}{generation}:{start}-{stop}"

    def check_generation(self, key: str, attributes: Mapping[str, Any]) -> None:
        """`StoreChangedError` when an answer for ``key`` comes from another generation of the store than
        the one opened (an overwrite being published, `outcore.storage.upload`)."""
        found, expected = attributes.get(GENERATION), self.remote.generation
        if found and expected and found != expected:
            raise StoreChangedError(
                f"{self._where(key)} belongs to another version of the store than the one opened (it is being "
                "replaced, or was): open the dataset again to read the new store"
            )

    def _get(self, key: str, start: int, stop: int, version: Version) -> memoryview:
        import obstore

        options: dict[str, Any] = {"range": (version.offset + start, version.offset + stop)}
        if version.etag:
            options["if_match"] = version.etag
        target = version.object or key  # a member of a zip store: a range of the zip

        def request() -> tuple[Mapping[str, Any], Any]:  # the body too: a stall mid-body is a late answer
            result = obstore.get(self.remote.store, target, options=options)
            return result.attributes, result.bytes()

        attributes, body = self._call(key, f"read bytes {start}..{stop - 1} of",
                                      lambda: self._hedged(request, stop - start))
        self.check_generation(key, attributes)
        data = memoryview(body)
        with self._lock:
            self.traffic.bytes += len(data)
        if len(data) != stop - start:
            raise RemoteError(f"{self._where(key)}: asked for {stop - start} bytes, received {len(data)}; "
                              "the object store or a proxy cut the answer short: try again")
        return data

    def _hedged(self, request: Any, nbytes: int) -> Any:
        """``request()``; when it has not answered within `_hedge_after` (a stalled connection, a slow
        server), the same request again beside it: the first answer wins, a failure waits for the other."""
        began = time.monotonic()
        first = submit_request(request)
        after = self._hedge_after(nbytes)
        if after is None or wait([first], timeout=after).done:
            result = first.result()
            self.pace.took(began, time.monotonic(), nbytes)
            return result
        second = submit_request(request)
        with self._lock:
            self.traffic.hedged += 1
        winner = next(iter(wait([first, second], return_when=FIRST_COMPLETED).done))
        if winner.exception() is None:
            self.pace.took(began, time.monotonic(), nbytes)
            return winner.result()
        return (second if winner is first else first).result()

    def _hedge_after(self, nbytes: int) -> float | None:
        """How long an answer of ``nbytes`` may take before it is asked again: `REQUEST_HEDGE_SECONDS`, or
        `REQUEST_HEDGE_FACTOR` times the median of the recent answers of at least a quarter of its size when
        that is longer (a busy link slows every answer alike, and asking twice would only add to it; a stall
        slows one; small answers, such as shard indexes, say little of a large one's time). None (wait for the request's
        own timeout) until 8 such answers are known, or once `HEDGE_SHARE` of the requests were asked
        twice."""
        recent = sorted(self.pace.times(at_least=nbytes / 4))
        with self._lock:
            spent = self.traffic.hedged > HEDGE_SHARE * self.traffic.requests
        if len(recent) < 8 or spent:
            return None
        return max(REQUEST_HEDGE_SECONDS, REQUEST_HEDGE_FACTOR * recent[len(recent) // 2])

    def _call(self, key: str, what: str, request: Any) -> Any:
        """``request()`` with retries: up to `ATTEMPTS` tries within `DEADLINE_SECONDS`, waiting a doubling,
        jittered backoff between them. A missing file is `FileNotFoundError`, a changed one
        `StoreChangedError`, and anything else still failing at the end one `RemoteError`."""
        import obstore.exceptions as failures

        began = time.monotonic()
        for attempt in range(1, ATTEMPTS + 1):
            with self._lock:
                self.traffic.requests += 1
            try:
                return request()
            except (FileNotFoundError, failures.NotFoundError):
                raise FileNotFoundError(key) from None
            except failures.PreconditionError:
                raise StoreChangedError(
                    f"{self._where(key)} changed after the store was opened (it was rewritten remotely): open the "
                    "dataset again to read the new store"
                ) from None
            except (failures.PermissionDeniedError, failures.UnauthenticatedError) as error:
                raise RemoteError(f"cannot {what} {self._where(key)}: access denied ({type(error).__name__}); "
                                  "check the credentials (storage_options= or AWS_ACCESS_KEY_ID, ...)") from None
            except (OSError, failures.BaseError) as error:
                waited = time.monotonic() - began
                pause = BACKOFF_SECONDS * 2 ** (attempt - 1) * random.uniform(0.5, 1.5)
                if attempt == ATTEMPTS or waited + pause > DEADLINE_SECONDS:
                    raise self.failure(what, key, error, attempt, waited) from None
                time.sleep(pause)
        raise AssertionError("unreachable")

    def failure(self, what: str, key: str, error: BaseException, tries: int | None = None,
                waited: float = 0.0) -> RemoteError:
        """The error of a request to ``key`` that kept failing (``tries`` times, or as often as the client's
        own retries allow): what, where, and what to do."""
        reason = str(error).splitlines()[0][:240] if str(error) else type(error).__name__
        attempts = f"{tries} tries over {waited:.1f} s" if tries else "the client's retries"
        return RemoteError(
            f"cannot {what} {self._where(key)}: {attempts} failed (last: {reason}); check the network and the "
            "endpoint, then iterate again (state_dict() says where to resume)"
        )

    def _where(self, key: str) -> str:
        return f"{redact(self.remote.url)}/{key}"


def coalesce(spans: Sequence[tuple[int, int]], limit: int | None = COALESCED_BYTES) -> list[list[tuple[int, int]]]:
    """``spans`` (``(offset, nbytes)`` of one file) grouped into runs stored back to back, each asked in
    one request: adjacent ranges coalesce (up to ``limit`` bytes a run), distant ones do not (a gap
    would be fetched for nothing).

    >>> coalesce([(200, 100), (0, 100), (100, 100), (1000, 50)])
    [[(0, 100), (100, 100), (200, 100)], [(1000, 50)]]
    >>> coalesce([(0, 100), (100, 100)], limit=150)
    [[(0, 100)], [(100, 100)]]
    """
    runs: list[list[tuple[int, int]]] = []
    size = 0
    for offset, nbytes in sorted(set(spans)):
        last = runs[-1][-1] if runs else None
        if last is not None and offset == last[0] + last[1] and (limit is None or size + nbytes <= limit):
            runs[-1].append((offset, nbytes))
            size += nbytes
        else:
            runs.append([(offset, nbytes)])
            size = nbytes
    return runs


def _obstore_range(request: Any) -> Any:
    """zarr's byte request as obstore's ``range`` option."""
    if isinstance(request, RangeByteRequest):
        return (request.start, request.end)
    if isinstance(request, OffsetByteRequest):
        return {"offset": request.offset}
    if isinstance(request, SuffixByteRequest):
        return {"suffix": request.suffix}
    raise TypeError(f"unexpected byte request {request!r}")


def _after_fork_in_child() -> None:
    global _forked_after_use
    _forked_after_use = _forked_after_use or _used


os.register_at_fork(after_in_child=_after_fork_in_child)


def object_store_client(url: str, options: Mapping[str, Any]) -> Any:
    """An obstore client for ``url``: ``options`` as obstore's ``from_url`` takes them, plain HTTP allowed
    when the endpoint asks for it, outcore's timeouts where none are given. In a process forked after
    obstore was used, an `OptionError` saying how to start it instead (never a hang)."""
    global _used
    if _forked_after_use:
        raise OptionError(f"{redact(url)}: {FORKED_AFTER_USE}")
    _used = True
    try:
        from obstore.store import from_url
    except ImportError:
        raise OptionError(
            f"{redact(url)}: reading object stores needs obstore: pip install 'outcore[remote]'"
        ) from None
    settings = dict(options)
    client = {**CLIENT_DEFAULTS, **dict(settings.pop("client_options", None) or {})}
    endpoint = str(settings.get("endpoint") or settings.get("endpoint_url")
                   or next((os.environ[v] for v in _ENDPOINT_VARIABLES if os.environ.get(v)), ""))
    if "endpoint_url" in settings:
        settings["endpoint"] = settings.pop("endpoint_url")
    if endpoint.startswith("http://") or urlsplit(url).scheme == "http":
        client.setdefault("allow_http", True)
    # obstore's own retries serve zarr's metadata reads; the ranged reads are retried by RemoteFiles._call too
    retry = settings.pop("retry_config", None) or {
        "max_retries": 3, "retry_timeout": timedelta(seconds=DEADLINE_SECONDS / 4),
        "backoff": {"init_backoff": timedelta(seconds=BACKOFF_SECONDS), "max_backoff": timedelta(seconds=5),
                    "base": 2.0}}
    try:
        return from_url(url, client_options=client, retry_config=retry, **settings)
    except Exception as error:  # obstore's configuration errors share no base class
        if type(error).__module__.startswith("obstore") or isinstance(error, ValueError | TypeError):
            keys = ", ".join(sorted(options)) or "none"
            raise OptionError(f"{redact(url)}: the object store cannot be set up from storage_options (keys: "
                              f"{keys}) and the environment: {type(error).__name__}; see obstore's from_url "
                              "for the settings of this kind of store") from None
        raise
