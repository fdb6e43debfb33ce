"""Bytes in and out: groups at a directory, a ``.zip`` file or a URL (object stores read by outcore
itself, through a node-local cache); the direct shard reader; staging and atomic commit; the checks
made on open."""

from .cache import CacheUsage, ChunkCache
from .chunk_reads import read_file_at_once, read_files_at_once, stat_files_at_once
from .encoded import EncodedBytes, create_encoded_field, read_files, stored_nbytes, write_encoded_shard
from .groups import (
    consolidate,
    create_field,
    describe_classes,
    is_url,
    is_zip,
    make_durable,
    open_group,
    samples_per_shard,
    shard_path,
    small_fields,
    small_rows_path,
    writable,
)
from .ragged import (
    RaggedChunk,
    RaggedRows,
    RaggedSamples,
    create_ragged_field,
    read_ragged,
    write_ragged_shard,
)
from .remote import RemoteStore, is_object_url, redact
from .shard_reader import ShardReader, read_samples
from .shard_writer import StoreArrays, copy_rows, write_rows
from .small_rows import SmallColumn, SmallRows
from .staging import Staging, check_target, local_target, pack_zip, put_in_place, remove_path, staged_store
from .store import Store, open_store
from .upload import Upload
from .zipstore import RangeZipStore, stored_members

__all__ = [
    "CacheUsage",
    "ChunkCache",
    "EncodedBytes",
    "RaggedChunk",
    "RaggedRows",
    "RaggedSamples",
    "RangeZipStore",
    "RemoteStore",
    "ShardReader",
    "SmallColumn",
    "SmallRows",
    "Staging",
    "Store",
    "StoreArrays",
    "Upload",
    "check_target",
    "consolidate",
    "copy_rows",
    "create_encoded_field",
    "create_field",
    "create_ragged_field",
    "describe_classes",
    "is_object_url",
    "is_url",
    "is_zip",
    "local_target",
    "make_durable",
    "open_group",
    "open_store",
    "pack_zip",
    "put_in_place",
    "read_file_at_once",
    "read_files",
    "read_files_at_once",
    "read_ragged",
    "read_samples",
    "redact",
    "remove_path",
    "samples_per_shard",
    "shard_path",
    "small_fields",
    "small_rows_path",
    "staged_store",
    "stat_files_at_once",
    "stored_members",
    "stored_nbytes",
    "writable",
    "write_encoded_shard",
    "write_ragged_shard",
    "write_rows",
]
