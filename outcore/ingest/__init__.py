"""Writing stores: sources (image folders, tables) → delayed decode tasks → dask arrays → a staged store,
shuffled on write in bounded memory; and `Writer`, which appends batches to a growing store."""

from .arrays import from_arrays
from .images import ingest_dataframe, ingest_images
from .scheduler import active_client, progress_bar
from .splits import ingest_splits
from .writer import Writer

__all__ = ["Writer", "active_client", "from_arrays", "ingest_dataframe", "ingest_images", "ingest_splits", "progress_bar"]
