"""Writing stores: sources (image folders, tables, record files) → delayed decode tasks → dask arrays → a staged store,
shuffled on write in bounded memory; and `Writer`, which appends batches to a growing store."""

from .arrays import from_arrays
from .coco import ingest_coco
from .from_records import ingest_records
from .images import ingest_dataframe, ingest_images
from .options import IngestKeywords
from .records import LMDB, Parquet, TFRecord, WebDataset
from .scheduler import active_client, progress_bar
from .splits import ingest_splits
from .voc import ingest_voc
from .writer import Writer

__all__ = ["LMDB", "IngestKeywords", "Parquet", "TFRecord", "WebDataset", "Writer", "active_client", "from_arrays", "ingest_coco",
           "ingest_dataframe",
           "ingest_images", "ingest_records", "ingest_splits", "ingest_voc", "progress_bar"]
