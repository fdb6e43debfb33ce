"""Reading a store for training: the shuffle plan and the batch schedule (pure), the runs that follow
them (local threads or a Dask cluster), `BatchIterator`, batch transforms and shuffle quality."""

from .batch import Batch, Transform
from .iterator import BatchIterator
from .options import BatchKeywords, BatchOptions
from .plan import Consumer, EpochPlan, batch_count, batches_in, rank_batch_count
from .quality import ShuffleQuality, shuffle_quality
from .readers import ChunkReader, chunk_reader, recipe, sample_spec
from .schedule import BatchStep, max_held, schedule

__all__ = [
    "Batch",
    "BatchIterator",
    "BatchKeywords",
    "BatchOptions",
    "BatchStep",
    "ChunkReader",
    "Consumer",
    "EpochPlan",
    "ShuffleQuality",
    "Transform",
    "batch_count",
    "batches_in",
    "chunk_reader",
    "max_held",
    "rank_batch_count",
    "recipe",
    "sample_spec",
    "schedule",
    "shuffle_quality",
]
