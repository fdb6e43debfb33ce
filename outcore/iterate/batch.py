"""What a batch is (a dict of numpy arrays, samples on axis 0) and how one is made from loaded chunks."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..errors import OptionError
from ..format import decode_text
from ..imaging import Box, EncodedChunk, empty_for_decoding
from ..seeds import Domain, generator
from ..threads import for_each_run

Batch = dict[str, np.ndarray]
Transform = Callable[[Batch, np.random.Generator], Batch]
Draws = Sequence[tuple[int, tuple[int, ...]]]  # each piece of a batch: (samples, its generator's key), in order
ChunkValues = Mapping[str, Any]  # field -> one chunk's values: an array, or an EncodedChunk to decode


class Empty(Protocol):
    """Makes a batch's array of field ``field``: `plain` memory, or shared memory (`outcore.iterate.shared`)."""

    def __call__(self, shape: tuple[int, ...], dtype: np.dtype, field: str = "") -> np.ndarray: ...


def plain(shape: tuple[int, ...], dtype: np.dtype, field: str = "") -> np.ndarray:
    """A new array in plain memory, where the decoders write fastest (`outcore.imaging.empty_for_decoding`):
    the default `Empty`."""
    return empty_for_decoding(shape, dtype)


class Crop(Protocol):
    """A transform that cuts one box per image and resizes it to ``output_size`` (`RandomResizedCrop`,
    `CenterCrop`; `RandomCrop`'s windows, at their own size, may lie past the edges): opening a transform on
    an encoded field, it is done while decoding (`make_batch`)."""

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
    steps = _steps(transform)
    first = steps[0] if steps else None
    if not (hasattr(first, method) and getattr(first, "field", None) in fields):
        return None, transform
    return first, _composed(transform, steps[1:])


def _split_tail(transform: Transform | None) -> tuple[Transform | None, Transform | None]:
    """``(head, tail)`` of ``transform``: ``tail`` its last steps with ``random = False`` (None for none)."""
    steps = _steps(transform)
    cut = len(steps)
    while cut and getattr(steps[cut - 1], "random", True) is False:
        cut -= 1
    return _composed(transform, steps[:cut]), _composed(transform, steps[cut:])


def _steps(transform: Transform | None) -> list[Any]:
    """The steps of ``transform``: a `Compose`'s, or itself (none for None)."""
    return list(getattr(transform, "transforms", [transform])) if transform is not None else []


def _composed(like: Transform | None, steps: list[Any]) -> Transform | None:
    """``steps`` as one transform: None, the only step, or a composition of the kind of ``like``."""
    return None if not steps else steps[0] if len(steps) == 1 else type(like)(steps)


@dataclass(frozen=True)
class Recipe:
    """How a batch is made from loaded chunks, decided once per iteration: the ``fields`` (those in
    ``text_fields`` decoded to strings), the `Crop` done while decoding its encoded field and the `Flip`
    right after it (both None when the transform does not open so), and the ``rest`` of the transform: its
    steps up to the last that draws from the generator (``per_piece``), and those after (``after``, steps
    with ``random = False``, as `Normalize`: they run once on the joined batch, `make_batch`).

    >>> from outcore.transforms import Compose, Normalize, RandomFlip
    >>> recipe = Recipe.of(["images"], (), (), Compose([RandomFlip(), Normalize()]))
    >>> recipe.per_piece, recipe.after
    (RandomFlip(p=0.5, horizontal=True, vertical=False, field='images'), Normalize(mean=0.0, std=1.0, scale=None, field='images'))
    """

    fields: tuple[str, ...]
    text_fields: frozenset[str]
    transform: Transform | None
    crop: Crop | None = None
    flip: Flip | None = None
    rest: Transform | None = None
    per_piece: Transform | None = None
    after: Transform | None = None

    @classmethod
    def of(cls, fields: Sequence[str], text_fields: Collection[str], encoded_fields: Collection[str],
           transform: Transform | None) -> Recipe:
        """The recipe of ``fields`` with ``transform``; ``encoded_fields`` are those stored as files."""
        crop, rest = fused_crop(transform, encoded_fields)
        flip = None
        if crop is not None:
            flip, rest = _split_head(rest, "draw", {crop.field})
        return cls(tuple(fields), frozenset(text_fields), transform, crop, flip, rest, *_split_tail(rest))

    @property
    def crop_field(self) -> str | None:
        """The encoded field cut while decoding, if any."""
        return None if self.crop is None else self.crop.field


def make_batch(recipe: Recipe, samples: np.ndarray, chunk_size: int, keys: np.ndarray, data: Mapping[int, ChunkValues],
               draws: Draws, empty: Empty = plain) -> Batch:
    """`assemble` then the transform, piece by piece: ``draws`` holds each piece's ``(samples, key)``
    (`batch_draws`), and each piece of the batch is transformed with a generator of its key, the pieces
    joined in order; the transform's last steps that draw nothing (`Recipe.after`) run once on the joined
    batch. The recipe's `Crop` is done while decoding (each box read from the file,
    `EncodedChunk.decode_region`), with the boxes the crop would have drawn on the decoded piece, and so is
    its `Flip` (each box mirrored as it is decoded), so the rest of the transform sees the same generator
    state. The batch's arrays are made by ``empty`` (a Dask worker's go to shared memory:
    `outcore.iterate.shared`)."""
    if recipe.transform is None:
        return assemble(samples, chunk_size, keys, data, recipe.fields, recipe.text_fields, empty)
    rngs = [transform_generator(key) for _, key in draws]
    bounds = np.cumsum([0, *(count for count, _ in draws)]).tolist()
    if bounds[-1] != len(samples):
        raise ValueError(f"the pieces {[count for count, _ in draws]} do not add up to the batch's {len(samples)}")
    per_piece, after = recipe.per_piece, recipe.after
    joined = len(draws) > 1 and per_piece is not None  # the pieces' results joined into new arrays
    returned = empty if after is None else plain  # makes the arrays handed back as they are
    made = plain if joined else returned
    if recipe.crop is None:
        batch = assemble(samples, chunk_size, keys, data, recipe.fields, recipe.text_fields, made)
    else:
        batch = _assemble_cropped(recipe, samples, chunk_size, keys, data, bounds, rngs, made)
    if per_piece is not None:
        pieces = [per_piece({name: values[low:high] for name, values in batch.items()}, rng)
                  for low, high, rng in zip(bounds[:-1], bounds[1:], rngs, strict=True)]
        batch = join(pieces, returned) if joined else pieces[0]
    return batch if after is None else after(batch, None)


def _assemble_cropped(recipe: Recipe, samples: np.ndarray, chunk_size: int, keys: np.ndarray,
                      data: Mapping[int, ChunkValues], bounds: list[int], rngs: list[np.random.Generator],
                      empty: Empty) -> Batch:
    """The batch with the recipe's crop (and flip) done while decoding, their draws made piece by piece."""
    crop = recipe.crop
    within_chunk = samples % chunk_size
    chunks, local = keys.tolist(), within_chunk.tolist()
    sizes = [data[key][crop.field].sample_shape(index)[:2] for key, index in zip(chunks, local, strict=True)]
    boxes: list[Box] = []
    flips: list[tuple[bool, bool]] = []
    for low, high, rng in zip(bounds[:-1], bounds[1:], rngs, strict=True):
        try:
            boxes += crop.boxes(sizes[low:high], rng)
        except OptionError as error:  # a picture too small for the crop: name it
            raise _too_small(error, crop, [data[key][crop.field] for key in chunks[low:high]], local[low:high],
                             sizes[low:high]) from None
        flips += recipe.flip.draw(high - low, rng).tolist() if recipe.flip is not None else [(False, False)] * (high - low)
    batch = assemble(samples, chunk_size, keys, data, [n for n in recipe.fields if n != crop.field],
                     recipe.text_fields, empty)
    batch[crop.field] = _decode_regions(keys, within_chunk, data, crop, boxes, flips, empty)
    return {name: batch[name] for name in recipe.fields}


def _too_small(error: OptionError, crop: Crop, sources: list[EncodedChunk], indices: list[int],
               sizes: list[tuple[int, int]]) -> OptionError:
    """``error`` (the crop cannot cut its box from a picture of ``sizes``), naming the first picture it
    cannot cut from."""
    for source, index, size in zip(sources, indices, sizes, strict=True):
        try:
            crop.boxes([size], np.random.default_rng(0))
        except OptionError:
            return OptionError(f"{source.sample_name(index)}: {error}")
    return error


def join(pieces: Sequence[Batch], empty: Empty = plain) -> Batch:
    """The pieces of a batch, field by field, in order, as one batch (arrays made by ``empty``; text as wide
    as its widest piece).

    >>> join([{"x": np.arange(2), "t": np.array(["a"])}, {"x": np.arange(3), "t": np.array(["bcd"])}])
    {'x': array([0, 1, 0, 1, 2]), 't': array(['a', 'bcd'], dtype='<U3')}
    """
    return {name: join_field([piece[name] for piece in pieces], name, empty) for name in pieces[0]}


def join_field(parts: Sequence[np.ndarray], field: str, empty: Empty = plain) -> np.ndarray:
    """Field ``field``'s ``parts`` as one array made by ``empty``, never cast (a ``TypeError`` where the parts
    disagree on their dtype); text as wide as its widest part.

    >>> join_field([np.arange(2, dtype=np.int32), np.arange(2)], "x")
    Traceback (most recent call last):
    ...
    TypeError: Cannot cast array data from dtype('int64') to dtype('int32') according to the rule 'no'
    """
    first = parts[0]
    if first.dtype.kind in "USO":
        return np.concatenate(parts)
    out = empty((sum(len(part) for part in parts), *first.shape[1:]), first.dtype, field=field)
    return np.concatenate(parts, out=out, casting="no")


def _decode_regions(keys: np.ndarray, local: np.ndarray, data: Mapping[int, ChunkValues], crop: Crop,
                    boxes: list[Box], flips: list[tuple[bool, bool]], empty: Empty) -> np.ndarray:
    """Box ``boxes[i]`` of sample ``local[i]`` of chunk ``keys[i]`` resized to the crop's size and mirrored as
    ``flips[i]`` says, for every ``i``, into a new array (made by ``empty``), on the thread pool
    (`EncodedChunk.decode_regions`: plain JPEGs cut together in C)."""
    first = next(iter(data.values()))[crop.field]
    out = empty((len(local), *crop.output_size, *first.decode.shape[2:]), first.dtype, field=crop.field)

    def decode(chunk: int, rows: np.ndarray) -> None:
        data[chunk][crop.field].decode_regions(local[rows], [boxes[i] for i in rows.tolist()], crop.output_size, out,
                                               rows, [flips[i] for i in rows.tolist()])

    _by_chunk(keys, decode)
    return out


def _decode_samples(keys: np.ndarray, local: np.ndarray, data: Mapping[int, ChunkValues], field: str,
                    out: np.ndarray) -> None:
    """Sample ``local[i]`` of chunk ``keys[i]`` decoded into ``out[i]``, for every ``i``, on the thread pool
    (`EncodedChunk.decode_samples`: plain JPEGs decoded together in C)."""
    _by_chunk(keys, lambda chunk, rows: data[chunk][field].decode_samples(local[rows], out, rows))


def _by_chunk(keys: np.ndarray, work: Callable[[int, np.ndarray], None]) -> None:
    """``work(chunk, rows)`` over a batch's rows (``keys[i]``: the chunk of row ``i``), on the thread pool: the
    rows taken in order of their chunk, each thread's run of them (`for_each_run`) a call per chunk."""
    order = np.argsort(keys, kind="stable")
    chunks = keys[order]

    def run(start: int, stop: int) -> None:
        changes = start + 1 + np.flatnonzero(chunks[start + 1 : stop] != chunks[start : stop - 1])  # a new chunk's first row
        for low, high in itertools.pairwise([start, *changes.tolist(), stop]):
            work(int(chunks[low]), order[low:high])

    for_each_run(run, len(keys))


def assemble(
    samples: np.ndarray, chunk_size: int, keys: np.ndarray, data: Mapping[int, ChunkValues], fields: Sequence[str],
    text_fields: frozenset[str], empty: Empty = plain,
) -> Batch:
    """A new batch of ``samples``: sample ``i`` is copied once, straight from chunk ``data[keys[i]]`` into
    the batch (no temporaries); encoded images are decoded into the batch, text fields decoded to strings.
    The batch's arrays are always new (made by ``empty``): nothing the caller is handed is ever written again.
    """
    batch = {}
    for name in fields:
        first = next(iter(data.values()))[name]
        shape = (len(samples), *first.shape[1:])
        out = np.empty(shape, first.dtype) if name in text_fields else empty(shape, first.dtype, field=name)
        if out.ndim == 1:  # scalars per sample: one vectorized gather per chunk is cheaper
            for key, values in data.items():
                where = keys == key
                out[where] = values[name][samples[where] % chunk_size]
        elif isinstance(first, EncodedChunk):  # decoded straight into the batch, on the thread pool
            _decode_samples(keys, samples % chunk_size, data, name, out)
        else:
            sources = [data[key][name] for key in keys.tolist()]
            for i, (source, index) in enumerate(zip(sources, (samples % chunk_size).tolist(), strict=True)):
                out[i] = source[index]
        batch[name] = decode_text(out) if name in text_fields else out
    return batch


def batch_draws(seed: int, epoch: int, step: int, pieces: Sequence[tuple[int, int]]) -> Draws:
    """The ``(samples, key)`` of each piece of a batch at ``step`` (`EpochPlan.pieces`' ``(key, samples)``):
    its augmentation generator's key (`transform_generator`) is the piece's stream and the step, not the rank
    or loader worker that makes it, so a global step is augmented alike on any number of either.

    >>> batch_draws(0, 3, 7, ((2, 32), (3, 32)))
    ((32, (0, 3, 7, 2)), (32, (0, 3, 7, 3)))
    """
    return tuple((count, (seed, epoch, step, key)) for key, count in pieces)


def transform_generator(rng_key: Sequence[int]) -> np.random.Generator:
    """The generator a batch's transform draws from, in the transform's own seed domain."""
    return generator(Domain.TRANSFORM, *rng_key)


def apply_transform(transform: Transform | None, batch: Batch, rng_key: Sequence[int]) -> Batch:
    """``transform(batch, rng)`` with the generator of ``rng_key`` (`transform_generator`)."""
    return batch if transform is None else transform(batch, transform_generator(rng_key))
