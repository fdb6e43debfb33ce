"""How samples are grouped on disk: chunks of samples (the unit of I/O and shuffling) in shard files."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import OptionError

TARGET_CHUNK_BYTES = 8 * 2**20
TARGET_SHARD_BYTES = 128 * 2**20
SMALL_SHARD_BYTES = 8 * 2**20  # a small field's shard files hold about this much (labels, paths, byte ranges)
MAX_CHUNKS_PER_SHARD = 1024
MAX_CHUNK_SIZE = 65536
MIN_SHARDS = 8


@dataclass(frozen=True)
class Layout:
    """``chunk_size`` samples per chunk, ``shard_size`` (a multiple) per shard file.

    >>> Layout(128, 1024).chunks_per_shard
    8
    """

    chunk_size: int
    shard_size: int

    def __post_init__(self) -> None:
        if self.chunk_size < 1 or self.shard_size < self.chunk_size or self.shard_size % self.chunk_size:
            raise OptionError(
                f"chunk_size={self.chunk_size} must be >= 1 and divide shard_size={self.shard_size}"
            )

    @property
    def chunks_per_shard(self) -> int:
        return self.shard_size // self.chunk_size

    def shard_size_for(self, sample_nbytes: int) -> int:
        """The samples in one shard file of a field of ``sample_nbytes`` a sample: `shard_size` for the
        pictures, and for a small field (labels, paths, an encoded field's byte ranges) as many whole
        chunks as make about `SMALL_SHARD_BYTES` (a power of two of them, `MAX_CHUNKS_PER_SHARD` at most),
        so that a store holds about one file per shard of pictures and one or a few per small field.
        Always a multiple of `shard_size`: a shard of pictures lies within one of each small field.

        >>> layout = Layout(128, 1024)
        >>> layout.shard_size_for(128 * 128 * 3), layout.shard_size_for(8), layout.shard_size_for(256)
        (1024, 131072, 32768)
        """
        chunks = _power_of_two_at_most(SMALL_SHARD_BYTES // (self.chunk_size * max(1, sample_nbytes)),
                                       MAX_CHUNKS_PER_SHARD)
        return max(self.shard_size, self.chunk_size * chunks)

    @classmethod
    def for_samples(
        cls, sample_nbytes: int, num_samples: int | None, chunk_size: int | None = None
    ) -> Layout:
        """Chunks of about 8 MiB (a power of two of samples) and shard files of at most about 128 MiB.

        Each ingest task decodes and writes one whole shard, so the shard size bounds a task's memory,
        and small stores get at least ``MIN_SHARDS`` shards so that every core has work: 10,000 128x128
        RGB images make 10 shard files per field, a million about 500.

        >>> Layout.for_samples(128 * 128 * 3, 10_000)
        Layout(chunk_size=128, shard_size=1024)
        """
        sample_nbytes = max(1, sample_nbytes)
        if chunk_size is None:
            largest = MAX_CHUNK_SIZE if not num_samples else min(MAX_CHUNK_SIZE, 1 << (num_samples - 1).bit_length())
            chunk_size = _power_of_two_at_most(TARGET_CHUNK_BYTES // sample_nbytes, largest)
        chunk_size = int(chunk_size)
        if chunk_size < 1:
            raise OptionError(f"chunk_size={chunk_size} must be a positive number of samples")
        chunks_per_shard = _power_of_two_at_most(TARGET_SHARD_BYTES // (chunk_size * sample_nbytes), MAX_CHUNKS_PER_SHARD)
        if num_samples:
            chunks = math.ceil(num_samples / chunk_size)
            chunks_per_shard = min(chunks_per_shard, _power_of_two_at_most(max(1, chunks // MIN_SHARDS), chunks))
        return cls(chunk_size, chunk_size * max(1, chunks_per_shard))


def _power_of_two_at_most(value: int, cap: int) -> int:
    return min(cap, 1 << max(0, int(value).bit_length() - 1))
