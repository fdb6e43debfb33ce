"""outcore: train on array datasets far larger than RAM.

Ingest images or arrays into chunked, compressed Zarr v3 stores with Dask, open them lazily, and stream
them to training loops. The public names are listed in ``__all__``; the layers they come from are the
sub-packages, lowest first: `errors`, `seeds`, `threads`, `format`, `storage`, `imaging`, `iterate`, `adapters`, `dataset`,
`ingest`, `cli`, `testing` (docs/architecture.md).
"""

from importlib.metadata import version

from . import transforms
from .cli import VerifyReport, verify
from .dataset import Dataset, open_dataset
from .errors import (
    ClusterError,
    CorruptChunkError,
    ImageError,
    IterationClosedError,
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
from .format import Compression
from .ingest import (
    LMDB,
    Parquet,
    TFRecord,
    WebDataset,
    Writer,
    from_arrays,
    ingest_dataframe,
    ingest_images,
    ingest_records,
    ingest_splits,
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

__version__ = version("outcore")

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
    "IterationClosedError",
    "Mixture",
    "NotAStoreError",
    "OptionError",
    "OutcoreError",
    "OutcoreWarning",
    "Parquet",
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
    "ingest_dataframe",
    "ingest_images",
    "ingest_records",
    "ingest_splits",
    "mix",
    "open_dataset",
    "set_threads",
    "shuffle_quality",
    "thread_count",
    "transforms",
    "verify",
    "worker_environment",
]
