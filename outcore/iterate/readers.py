"""The chunk reader of each field, as the iterator reads it: stored values, or decoded pixels."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import OptionError
from ..format import kept_name, offsets_name, undecoded_names
from ..imaging import DecodedChunks, EncodedChunk
from ..storage import RaggedRows, RaggedSamples, ShardReader, Store
from .batch import Recipe, Transform, steps


class EncodedChunks:
    """The chunk reader of an encoded image field as the iterator reads it: ``read(k)`` is chunk ``k`` as an
    `EncodedChunk`, whose samples are decoded straight into the batches that use them (cropped while
    decoding when the transform opens with a crop, `outcore.iterate.batch.make_batch`). A chunk's samples
    are decoded once each, by the batch that holds them, whoever else reads the chunk (a loader worker
    whose turns use a few of its samples decodes only those), and chunks are held encoded."""

    def __init__(self, store: Store, field: str) -> None:
        self.decoded = DecodedChunks(store, field)

    def empty(self) -> np.ndarray:
        return self.decoded.bytes.empty()

    @property
    def remote(self) -> bool:
        return self.decoded.remote

    def prefetch(self, chunks: Sequence[int]) -> None:
        self.decoded.prefetch(chunks)

    def expect(self, chunk: int, when: float) -> None:
        self.decoded.expect(chunk, when)

    def read(self, chunk: int, out: np.ndarray | None = None) -> EncodedChunk:
        return self.decoded.read_encoded(chunk, out)

    @property
    def sources(self) -> tuple[ShardReader, ...]:
        """The shard readers `read` reads a chunk with (`EncodedBytes.sources`), to read with other fields' in one call."""
        return self.decoded.bytes.sources

    def of_parts(self, chunk: int, read: Sequence[np.ndarray]) -> EncodedChunk:
        """`read`'s chunk from its `sources`' reads."""
        return self.decoded.encoded_of_parts(chunk, read)


ChunkReader = ShardReader | DecodedChunks | EncodedChunks | RaggedRows
BatchReader = ShardReader | EncodedChunks | RaggedRows  # a field's reader as batches read it (`chunk_readers`)


def chunk_reader(store: Store, field: str) -> ChunkReader:
    """``reader.read(k)`` is chunk ``k`` of ``field``: its stored values (text as UTF-8 bytes), or, for an
    encoded image field, its samples decoded, for a ragged field each sample's rows (an object array);
    ``reader.empty()`` is a buffer that ``read`` can fill."""
    if store.info(field).is_image:
        return DecodedChunks(store, field)
    if store.info(field).is_ragged or store.info(field).is_raster:
        return RaggedSamples(store.array, field, store.location, len(store), raster=store.info(field).is_raster,
                             pins=store.pins, indexes=store.shard_indexes)
    return store.shard_reader(field)


def recipe(store: Store, fields: Sequence[str], transform: Transform | None, decode: str = "here") -> Recipe:
    """How batches of ``fields`` of ``store`` are made with ``transform`` (`Recipe`), their encoded pictures
    decoded ``"here"`` or ``"later"`` (`undecoded_recipe`); a field of pictures of
    varying sizes that ``transform`` does not open by cropping is an `OptionError` saying what to do
    (only the crop gives its batches one size); so is a field named as a batch names another's offsets or kept
    rows (``boxes`` and ``boxes_offsets``: `outcore.format.ragged`), which the batch could not tell apart."""
    clash = next(((name, other) for name in fields for other in (offsets_name(name), kept_name(name),
                                                                 *undecoded_names(name)) if other in fields), None)
    if clash is not None:
        raise OptionError(f"fields {clash[0]!r} and {clash[1]!r} of {store.location}: a batch names a ragged field's "
                          "offsets and kept rows so, and could not tell them apart; leave one out with fields=")
    encoded = [name for name in fields if store.info(name).is_image]
    pictures = [name for name in fields if not (store.info(name).is_text or store.info(name).is_ragged
                                                or store.info(name).is_raster) and len(sample_spec(store, name)[0]) >= 2]
    later = undecoded_fields(store, encoded, transform) if decode == "later" else ()
    pixel_sizes = {name: sample_spec(store, name)[0][:2] for name in pictures
                   if name not in encoded or not store.info(name).decode.variable}
    made = Recipe.of(fields, [name for name in fields if store.info(name).is_text], pictures, transform,
                     [name for name in fields if store.info(name).is_ragged], later, pixel_sizes)
    if later:
        check_undecoded(made, store.location)
    for name in encoded:
        if store.info(name).decode.variable and made.crop_field != name:
            raise OptionError(
                f"field {name!r} of {store.location} holds pictures of varying sizes: batches need one size, so "
                f"open transform= with RandomResizedCrop(224, field={name!r}), CenterCrop(224, resize=256, "
                f"field={name!r}) or RandomCrop(224, field={name!r}), or leave it out with fields=; "
                f"ds[{name!r}][i] reads one picture at its size"
            )
    targets = getattr(made.crop, "targets", None)
    moved = () if targets is None else (*targets.label_maps, *targets.pictures)
    for name in fields:
        if store.info(name).is_raster and name not in moved:
            raise OptionError(
                f"field {name!r} of {store.location} holds maps of their pictures' own sizes: batches need one size, "
                f"so cut it with its pictures, opening transform= with a crop whose targets= name it (e.g. "
                f"RandomResizedCrop(224, targets=Targets(label_maps=({name!r},)))), or leave it out with fields=; "
                f"ds[{name!r}][i] reads one at its size")
    return made


def undecoded_fields(store: Store, encoded: Sequence[str], transform: Transform | None) -> list[str]:
    """The fields a ``decode="later"`` batch leaves undecoded: its encoded pictures (an `OptionError` where it has
    none, or where the transform moves targets with them)."""
    if not encoded:
        raise OptionError(f"decode='later' leaves encoded pictures' files undecoded, and the batches' fields of "
                          f"{store.location} hold none (pixels are decoded already): leave decode= out")
    for step in steps(transform):
        if getattr(step, "targets", None) is not None and getattr(step, "field", None) in encoded:
            raise OptionError(f"decode='later' with {step!r}: targets move with the pictures as they are decoded "
                              "here; leave decode= out, or targets= out of the transform")
    return list(encoded)


def check_undecoded(made: Recipe, location: str) -> None:
    """A transform step that would see the files a ``decode="later"`` batch holds instead of their pictures is an
    `OptionError`: only a crop opening the transform and a flip right after it are drawn for them."""
    for step in steps(made.rest):
        mine = type(step).__module__.startswith("outcore.") and getattr(step, "field", None) not in made.later
        if not mine:
            raise OptionError(
                f"decode='later': the step {step!r} of the transform would run on the batch before its pictures "
                f"{sorted(made.later)} of {location} are decoded (it holds their files): with decode='later' the "
                "transform of an encoded field may open with a crop of it and a flip right after, no more; do the "
                "rest (Normalize, ...) on the decoded batch")


def chunk_readers(store: Store, fields: Sequence[str]) -> dict[str, BatchReader]:
    """The readers of ``fields`` as batches read them; encoded image fields are read encoded (`EncodedChunks`),
    ragged and raster fields as their rows and ranges (`RaggedRows`)."""
    return {name: EncodedChunks(store, name) if store.info(name).is_image else
            RaggedRows(store.array, name, store.location, len(store), raster=store.info(name).is_raster,
                       pins=store.pins, indexes=store.shard_indexes) if store.info(name).is_ragged or store.info(name).is_raster
            else store.shard_reader(name) for name in fields}


def sample_spec(store: Store, field: str) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype of one sample of ``field`` as batches hold it (decoded pixels, strings; a ragged
    field's: of one of its rows; a raster's: None for its height and width, which vary)."""
    info = store.info(field)
    if info.is_image:
        return info.decode.shape, np.dtype(info.decode.dtype)
    if info.is_ragged:
        return info.sample_shape, np.dtype(info.dtype)
    if info.is_raster:
        return (None, None, *info.sample_shape), np.dtype(info.dtype)
    array = store.array(field)
    if info.is_text:
        return (), np.dtype(f"<U{array.shape[1]}")
    return tuple(array.shape[1:]), np.dtype(array.dtype)


def sample_bytes(store: Store, recipe: Recipe) -> int:
    """The bytes one sample takes in a batch of ``recipe`` before the rest of its transform (a crop done while
    decoding counts at its output size)."""
    total = 0
    for name in recipe.fields:
        shape, dtype = sample_spec(store, name)
        if name == recipe.crop_field or store.info(name).is_raster:  # cut to the crop's size as the batch is made
            shape = (*recipe.crop.output_size, *shape[2:])
        total += int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return total
