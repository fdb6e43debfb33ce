"""The exceptions outcore raises. Each message names the file, field or chunk at fault and what to do."""

from __future__ import annotations


class OutcoreError(Exception):
    """Base class of every error outcore raises on purpose."""


class OutcoreWarning(UserWarning):
    """Something outcore did on its own that the user should know of (it cleaned up after a dead run)."""


class OptionError(OutcoreError, ValueError):
    """An argument has a value outcore cannot use: the message names it and what it accepts."""


class StoreExistsError(OutcoreError, FileExistsError):
    """The target store exists and ``overwrite`` was not given."""


class StoreBusyError(OutcoreError, RuntimeError):
    """Another writer (in this process or another) holds the store: one writer at a time."""


class StorageError(OutcoreError, OSError):
    """Writing or reading a store's files failed at the system's level: no space left, no permission,
    a file where a folder should be, a disk that cannot read a sector (after bounded tries). The message
    names the path (and the field and chunk being read) and what to do."""


class NotAStoreError(OutcoreError, ValueError):
    """The path is missing, not a Zarr group, or not written by outcore."""


class UnsafeStoreError(OutcoreError, ValueError):
    """The store uses an object or pickle codec, which outcore refuses to read."""


class CorruptChunkError(OutcoreError, ValueError):
    """A chunk failed its checksum or could not be decompressed."""


class SampleDecodeError(OutcoreError, ValueError):
    """A sample of an encoded image field could not be decoded."""


class IterationClosedError(OutcoreError, RuntimeError):
    """A batch was asked of an iteration that was closed meanwhile (``close()``, or a new ``iter()`` of the
    same iterator): it will make no more batches."""


class RemoteError(OutcoreError, OSError):
    """An object store could not be read (or written) within the bounded retries: the network, the endpoint
    or the credentials; the message names the object."""


class StoreChangedError(OutcoreError, RuntimeError):
    """The store was replaced (overwritten, copied or moved over, rewritten in an object store) after it was
    opened: the reader stops rather than read another store's bytes. Open it again."""


class ClusterError(OutcoreError, RuntimeError):
    """The Dask cluster went away (or kept losing workers) while it was making batches."""


class LoaderProcessError(OutcoreError, RuntimeError):
    """A process making the batches (``process=True``, or one of ``process=n``) could not start, or died while
    making them."""


class SourceError(OutcoreError, ValueError):
    """The ingest source (folder, CSV, DataFrame, arrays) is missing or malformed."""


class ImageError(SourceError):
    """One image file could not be decoded or fitted to the requested shape."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason

    def __reduce__(self):  # keep both fields when a dask worker sends the error back
        return (type(self), (self.path, self.reason))
