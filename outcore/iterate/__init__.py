"""Reading a store for training: the shuffle plan and the batch schedule (pure), the runs that follow
them (local threads or a Dask cluster), `BatchIterator`, batch transforms and shuffle quality."""

from .batch import Batch, Transform, check_fields
from .cluster import WORKER_CONFIG, worker_environment
from .iterator import BatchIterator
from .options import BatchKeywords, BatchOptions
from .plan import DEFAULT_STREAMS, Consumer, EpochPlan, EpochSteps, batches_in
from .quality import ShuffleQuality, shuffle_quality
from .readers import ChunkReader, chunk_reader, recipe, sample_spec
from .schedule import BatchStep, max_held, schedule

__all__ = [
    "DEFAULT_STREAMS",
    "WORKER_CONFIG",
    "Batch",
    "BatchIterator",
    "BatchKeywords",
    "BatchOptions",
    "BatchStep",
    "ChunkReader",
    "Consumer",
    "EpochPlan",
    "EpochSteps",
    "ShuffleQuality",
    "Transform",
    "batches_in",
    "check_fields",
    "chunk_reader",
    "max_held",
    "recipe",
    "sample_spec",
    "schedule",
    "shuffle_quality",
    "worker_environment",
]
