"""outcore: train on array datasets far larger than RAM.

Ingest images or arrays into chunked, compressed Zarr v3 stores with Dask, open them lazily, and stream
them to training loops. The public names are listed in ``__all__``.
"""

from importlib.metadata import version

from .dataset import Dataset, open_dataset
from .errors import (
    ClusterError,
    CorruptChunkError,
    ImageError,
    NotAStoreError,
    OutcoreError,
    SampleDecodeError,
    SourceError,
    StoreExistsError,
    UnsafeStoreError,
)
from .ingest import from_arrays, ingest_dataframe, ingest_images
from .loader import BatchIterator
from .quality import ShuffleQuality, shuffle_quality
from .schema import Compression
from .verify import verify
from .writer import Writer

__version__ = version("outcore")

__all__ = [
    "BatchIterator",
    "ClusterError",
    "Compression",
    "CorruptChunkError",
    "Dataset",
    "ImageError",
    "NotAStoreError",
    "OutcoreError",
    "SampleDecodeError",
    "ShuffleQuality",
    "SourceError",
    "StoreExistsError",
    "UnsafeStoreError",
    "Writer",
    "from_arrays",
    "ingest_dataframe",
    "ingest_images",
    "open_dataset",
    "shuffle_quality",
    "verify",
]
