"""What a batch is (a dict of numpy arrays, samples on axis 0) and how one is made from loaded chunks."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..format import decode_text
from ..imaging import Box, EncodedChunk
from ..seeds import Domain, generator
from ..threads import for_each

Batch = dict[str, np.ndarray]
Transform = Callable[[Batch, np.random.Generator], Batch]
ChunkValues = Mapping[str, Any]  # field -> one chunk's values: an array, or an EncodedChunk to decode
Empty = Callable[[tuple[int, ...], np.dtype], np.ndarray]  # makes a batch's arrays: np.empty, or shared memory


class Crop(Protocol):
    """A transform that cuts one box per image and resizes it (`RandomResizedCrop`, `CenterCrop`): opening
    a transform on an encoded field, it is done while decoding (`make_batch`)."""

    field: str

    @property
    def output_size(self) -> tuple[int, int]: ...

    def boxes(self, sizes: Sequence[tuple[int, int]], rng: np.random.Generator) -> list[Box]: ...

    def __call__(self, batch: Batch, rng: np.random.Generator) -> Batch: ...


class Flip(Protocol):
    """A transform that mirrors images at random (`RandomFlip`): right after a crop done while decoding,
    each box is mirrored as it is decoded."""

    field: str

    def draw(self, count: int, rng: np.random.Generator) -> np.ndarray: ...


def fused_crop(transform: Transform | None, encoded_fields: Collection[str]) -> tuple[Crop | None, Transform | None]:
    """``(crop, rest)`` when ``transform`` opens with a `Crop` of an encoded field, else ``(None, transform)``.

    >>> from outcore.transforms import Compose, RandomFlip, RandomResizedCrop
    >>> fused_crop(Compose([RandomResizedCrop(224), RandomFlip()]), {"images"})[0]
    RandomResizedCrop(size=224, scale=(0.08, 1.0), ratio=(0.75, 1.3333333333333333), field='images')
    """
    return _split_head(transform, "boxes", encoded_fields)


def _split_head(transform: Transform | None, method: str, fields: Collection[str]) -> tuple[Any, Transform | None]:
    """``(first, rest)`` when ``transform`` (or the first step of a `Compose`) has ``method`` and works on
    one of ``fields``, else ``(None, transform)``; ``rest`` is what is left (None for nothing)."""
    steps = list(getattr(transform, "transforms", [transform])) if transform is not None else []
    first = steps[0] if steps else None
    if not (hasattr(first, method) and getattr(first, "field", None) in fields):
        return None, transform
    rest = steps[1:]
    return first, (type(transform)(rest) if len(rest) > 1 else rest[0] if rest else None)


@dataclass(frozen=True)
class Recipe:
    """How a batch is made from loaded chunks, decided once per iteration: the ``fields`` (those in
    ``text_fields`` decoded to strings), the `Crop` done while decoding its encoded field and the `Flip`
    right after it (both None when the transform does not open so), and the ``rest`` of the transform.

    >>> Recipe(("labels",), frozenset(), None).crop is None
    True
    """

    fields: tuple[str, ...]
    text_fields: frozenset[str]
    transform: Transform | None
    crop: Crop | None = None
    flip: Flip | None = None
    rest: Transform | None = None

    @classmethod
    def of(cls, fields: Sequence[str], text_fields: Collection[str], encoded_fields: Collection[str],
           transform: Transform | None) -> Recipe:
        """The recipe of ``fields`` with ``transform``; ``encoded_fields`` are those stored as files."""
        crop, rest = fused_crop(transform, encoded_fields)
        flip = None
        if crop is not None:
            flip, rest = _split_head(rest, "draw", {crop.field})
        return cls(tuple(fields), frozenset(text_fields), transform, crop, flip, rest)

    @property
    def crop_field(self) -> str | None:
        """The encoded field cut while decoding, if any."""
        return None if self.crop is None else self.crop.field


def make_batch(recipe: Recipe, samples: np.ndarray, chunk_size: int, keys: np.ndarray, data: Mapping[int, ChunkValues],
               rng_key: Sequence[int], empty: Empty = np.empty) -> Batch:
    """`assemble` then the transform, seeded by ``rng_key``; the recipe's `Crop` is done while decoding
    (each box read from the file, `EncodedChunk.decode_region`), with the boxes the crop would have drawn
    on the decoded batch, and so is its `Flip` (each box mirrored as it is decoded), so the rest of the
    transform sees the same generator state. The batch's arrays are made by ``empty`` (a Dask worker's
    go to shared memory: `outcore.iterate.shared`)."""
    crop = recipe.crop
    if crop is None:
        return apply_transform(recipe.transform, assemble(samples, chunk_size, keys, data, recipe.fields,
                                                          recipe.text_fields, empty), rng_key)
    rng = transform_generator(rng_key)
    chunks, local = keys.tolist(), (samples % chunk_size).tolist()
    sizes = [data[key][crop.field].sample_shape(index)[:2] for key, index in zip(chunks, local, strict=True)]
    boxes = crop.boxes(sizes, rng)
    flips = recipe.flip.draw(len(samples), rng).tolist() if recipe.flip is not None else [(False, False)] * len(samples)
    batch = assemble(samples, chunk_size, keys, data, [n for n in recipe.fields if n != crop.field],
                     recipe.text_fields, empty)
    batch[crop.field] = _decode_regions(chunks, local, data, crop, boxes, flips, empty)
    batch = {name: batch[name] for name in recipe.fields}
    return batch if recipe.rest is None else recipe.rest(batch, rng)


def _decode_regions(chunks: list[int], indices: list[int], data: Mapping[int, ChunkValues], crop: Crop,
                    boxes: list[Box], flips: list[tuple[bool, bool]], empty: Empty) -> np.ndarray:
    first = next(iter(data.values()))[crop.field]
    out = empty((len(indices), *crop.output_size, *first.decode.shape[2:]), first.dtype)

    def decode(i: int) -> None:
        data[chunks[i]][crop.field].decode_region(indices[i], boxes[i], crop.output_size, out[i], flips[i])

    for_each(decode, len(indices))
    return out


def _decode_samples(sources: list[EncodedChunk], indices: list[int], out: np.ndarray) -> None:
    def decode(i: int) -> None:
        sources[i].decode_sample(indices[i], out[i])

    for_each(decode, len(indices))


def assemble(
    samples: np.ndarray, chunk_size: int, keys: np.ndarray, data: Mapping[int, ChunkValues], fields: Sequence[str],
    text_fields: frozenset[str], empty: Empty = np.empty,
) -> Batch:
    """A new batch of ``samples``: sample ``i`` is copied once, straight from chunk ``data[keys[i]]`` into
    the batch (no temporaries); encoded images are decoded into the batch, text fields decoded to strings.
    The batch's arrays are always new (made by ``empty``): nothing the caller is handed is ever written again.
    """
    local = (samples % chunk_size).tolist()
    batch = {}
    for name in fields:
        first = next(iter(data.values()))[name]
        out = (np.empty if name in text_fields else empty)((len(samples), *first.shape[1:]), first.dtype)
        if out.ndim == 1:  # scalars per sample: one vectorized gather per chunk is cheaper
            for key, values in data.items():
                where = keys == key
                out[where] = values[name][samples[where] % chunk_size]
        elif isinstance(first, EncodedChunk):  # decoded straight into the batch, on the thread pool
            _decode_samples([data[key][name] for key in keys.tolist()], local, out)
        else:
            sources = [data[key][name] for key in keys.tolist()]
            for i, (source, index) in enumerate(zip(sources, local, strict=True)):
                out[i] = source[index]
        batch[name] = decode_text(out) if name in text_fields else out
    return batch


def batch_rng_key(seed: int, epoch: int, rank: int, step: int) -> tuple[int, ...]:
    """The key of the augmentation generator (`transform_generator`) of ``rank``'s batch at ``step``: the
    same wherever the batch is made, by whichever loader worker.

    >>> batch_rng_key(0, 3, 1, 7)
    (0, 3, 1, 7)
    """
    return (seed, epoch, rank, step)


def transform_generator(rng_key: Sequence[int]) -> np.random.Generator:
    """The generator a batch's transform draws from, in the transform's own seed domain."""
    return generator(Domain.TRANSFORM, *rng_key)


def apply_transform(transform: Transform | None, batch: Batch, rng_key: Sequence[int]) -> Batch:
    """``transform(batch, rng)`` with the generator of ``rng_key`` (`transform_generator`)."""
    return batch if transform is None else transform(batch, transform_generator(rng_key))
