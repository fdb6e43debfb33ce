"""outcore: train on array datasets far larger than RAM.

Ingest images or arrays into chunked, compressed Zarr v3 stores with Dask, open them lazily, and stream
them to training loops. The public names are listed in ``__all__``; the layers they come from are the
sub-packages, lowest first: `errors`, `seeds`, `threads`, `format`, `storage`, `imaging`, `iterate`, `adapters`, `dataset`,
`ingest`, `cli`, `testing` (docs/architecture.md).

Names are imported when first used (PEP 562), so that ``import outcore`` costs little: a DataLoader or
Dask worker that only reads batches never imports the ingest, the command line, pandas or xarray.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import (
    ClusterError,
    CorruptChunkError,
    ImageError,
    IterationClosedError,
    LoaderProcessError,
    NotAStoreError,
    OptionError,
    OutcoreError,
    OutcoreWarning,
    RemoteError,
    SampleDecodeError,
    SourceError,
    StorageError,
    StoreBusyError,
    StoreChangedError,
    StoreExistsError,
    UnsafeStoreError,
)

_HOMES = {  # public name -> the module it comes from
    **dict.fromkeys(["Dataset", "open_dataset"], "dataset"),
    **dict.fromkeys(["VerifyReport", "verify"], "cli"),
    **dict.fromkeys(["Compression", "Ragged"], "format"),
    **dict.fromkeys(["LMDB", "IngestKeywords", "Parquet", "TFRecord", "WebDataset", "Writer", "from_arrays",
                     "ingest_coco", "ingest_dataframe", "ingest_images", "ingest_records", "ingest_splits", "ingest_voc"], "ingest"),
    **dict.fromkeys(["WORKER_CONFIG", "BatchIterator", "BatchKeywords", "ShuffleQuality", "shuffle_quality",
                     "worker_environment"], "iterate"),
    **dict.fromkeys(["Mixture", "mix"], "mixture"),
    **dict.fromkeys(["available_cpus", "set_threads", "thread_count"], "threads"),
}

if TYPE_CHECKING:  # what the names are, for type checkers and editors
    from . import transforms
    from .cli import VerifyReport, verify
    from .dataset import Dataset, open_dataset
    from .format import Compression, Ragged
    from .ingest import (
        LMDB,
        IngestKeywords,
        Parquet,
        TFRecord,
        WebDataset,
        Writer,
        from_arrays,
        ingest_coco,
        ingest_dataframe,
        ingest_images,
        ingest_records,
        ingest_splits,
        ingest_voc,
    )
    from .iterate import (
        WORKER_CONFIG,
        BatchIterator,
        BatchKeywords,
        ShuffleQuality,
        shuffle_quality,
        worker_environment,
    )
    from .mixture import Mixture, mix
    from .threads import available_cpus, set_threads, thread_count


def __getattr__(name: str) -> Any:
    """A public name, imported from its module when first asked for (then kept here)."""
    if name == "__version__":
        from importlib.metadata import version

        value: Any = version("outcore")
    elif name == "transforms":
        value = importlib.import_module(".transforms", __name__)
    elif name in _HOMES:
        value = getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
    else:
        raise AttributeError(f"module 'outcore' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, "__version__"})


__all__ = [
    "LMDB",
    "WORKER_CONFIG",
    "BatchIterator",
    "BatchKeywords",
    "ClusterError",
    "Compression",
    "CorruptChunkError",
    "Dataset",
    "ImageError",
    "IngestKeywords",
    "IterationClosedError",
    "LoaderProcessError",
    "Mixture",
    "NotAStoreError",
    "OptionError",
    "OutcoreError",
    "OutcoreWarning",
    "Parquet",
    "Ragged",
    "RemoteError",
    "SampleDecodeError",
    "ShuffleQuality",
    "SourceError",
    "StorageError",
    "StoreBusyError",
    "StoreChangedError",
    "StoreExistsError",
    "TFRecord",
    "UnsafeStoreError",
    "VerifyReport",
    "WebDataset",
    "Writer",
    "available_cpus",
    "from_arrays",
    "ingest_coco",
    "ingest_dataframe",
    "ingest_images",
    "ingest_records",
    "ingest_splits",
    "ingest_voc",
    "mix",
    "open_dataset",
    "set_threads",
    "shuffle_quality",
    "thread_count",
    "transforms",
    "verify",
    "worker_environment",
]
