"""What a batch is (a dict of numpy arrays, samples on axis 0) and how one is made from loaded chunks."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np

from ..errors import OptionError
from ..format import OFFSETS_SUFFIX, kept_name, offsets_name
from ..imaging import Box, EncodedChunk
from ..seeds import Domain, crops_and_flips, generator
from ..storage import RaggedChunk
from .gather import ChunkValues, Cut, Empty, Rows, assemble, move_pictures, one_size, picture_sizes, plain
from .targets import check_targets, moved

Batch = dict[str, np.ndarray]
Transform = Callable[[Batch, np.random.Generator], Batch]
Draws = Sequence[tuple[int, tuple[int, ...]]]  # each piece of a batch: (samples, its generator's key), in order


class Crop(Protocol):
    """A transform that cuts one box per image and resizes it to ``output_size`` (`RandomResizedCrop`,
    `CenterCrop`; `RandomCrop`'s windows, at their own size, and `ScaleJitter`'s may lie past the edges): opening a
    transform on a picture field, it is done as the batch is made (`make_batch`): while decoding an encoded field,
    while copying a pixel field's samples out of their chunks. A crop class whose every box is a window of whole
    pixels at its output size says so in a class attribute of its own, ``windows = True`` (`RandomCrop`): its boxes
    are then copied as they are, unchecked."""

    field: str

    @property
    def output_size(self) -> tuple[int, int]: ...

    def boxes(self, sizes: Sequence[tuple[int, int]], rng: np.random.Generator) -> Sequence[Box] | np.ndarray: ...

    def __call__(self, batch: Batch, rng: np.random.Generator) -> Batch: ...


class PiecesAtOnce(Protocol):
    """A `Crop` that may draw the boxes (and the `Flip`'s mirrors) of a batch's pieces in one call, as each piece's
    generator would (`RandomCrop.boxes_of_pieces`): ``(boxes, flips)``, or None to draw them piece by piece."""

    def boxes_of_pieces(self, sizes: np.ndarray, pieces: Draws, flip: Flip | None
                        ) -> tuple[np.ndarray, np.ndarray] | None: ...


class Flip(Protocol):
    """A transform that mirrors images at random (`RandomFlip`): right after a crop done as the batch is
    made, each box is mirrored as it is cut."""

    field: str

    def draw(self, count: int, rng: np.random.Generator) -> np.ndarray: ...


@dataclass(frozen=True)
class WholePictures:
    """The `Crop` of a transform that opens with a plain `RandomFlip` (its own class, no targets) of a picture field
    of pictures of ``size`` (pixels, or encoded pictures decoded to one size): every box the whole picture, drawn from
    nothing, so that the flip's mirrors are drawn as the flip draws them and each picture is mirrored as it is copied
    out of its chunk, or decoded (`Recipe.of`), where the flip alone copied the batch again, a piece at a time, and
    the pieces were joined once more.

    >>> WholePictures("images", (4, 6)).boxes([(4, 6)] * 2, None).tolist()
    [[0.0, 0.0, 4.0, 6.0], [0.0, 0.0, 4.0, 6.0]]
    """

    field: str
    size: tuple[int, int]
    windows: ClassVar[bool] = True  # every box is the picture itself: a window of whole pixels at the output size

    @property
    def output_size(self) -> tuple[int, int]:
        return self.size

    def boxes(self, sizes: Sequence[tuple[int, int]] | np.ndarray, rng: np.random.Generator | None) -> np.ndarray:
        return np.tile(np.array([0.0, 0.0, *self.size]), (len(sizes), 1))

    def boxes_of_pieces(self, sizes: np.ndarray, pieces: Draws, flip: object) -> tuple[np.ndarray, np.ndarray] | None:
        """The boxes and ``flip``'s mirrors of a batch's pieces, each drawn as its generator draws them in
        `RandomFlip.draw`, in one call (`outcore.seeds.crops_and_flips`: a window of the picture's own size has one
        place, which draws nothing); None without the C extension, or a flip of another kind."""
        if not vars(type(flip)).get("whole_pictures", False):
            return None
        return crops_and_flips(TRANSFORM_DOMAIN, pieces, (1, 1), flip.p, (flip.horizontal, flip.vertical),
                               window=self.size)

    def cut_boxes(self, pictures: np.ndarray, boxes: np.ndarray, flips: np.ndarray | None = None) -> np.ndarray:
        """The ``pictures`` (``boxes``: each whole) copied, mirrored as ``flips`` says: a plain `RandomFlip` after a
        user's step, on the joined batch (`on_joined`)."""
        return move_pictures(pictures, boxes, self.size, flips)

    def __call__(self, batch: Batch, rng: np.random.Generator) -> Batch:
        return batch


def fused_crop(transform: Transform | None, picture_fields: Collection[str]) -> tuple[Crop | None, Transform | None]:
    """``(crop, rest)`` when ``transform`` opens with a `Crop` of a picture field, else ``(None, transform)``.

    >>> from outcore.transforms import Compose, RandomFlip, RandomResizedCrop
    >>> fused_crop(Compose([RandomResizedCrop(224), RandomFlip()]), {"images"})[0]
    RandomResizedCrop(size=224, scale=(0.08, 1.0), ratio=(0.75, 1.3333333333333333), field='images', targets=None)
    """
    return _split_head(transform, "boxes", picture_fields)


def _whole_pictures(transform: Transform | None, pixel_sizes: Mapping[str, tuple[int, int]]) -> WholePictures | None:
    """`WholePictures` of the picture field a plain `RandomFlip` (its own class says so: ``whole_pictures``; no
    targets) opening ``transform`` mirrors, if it is one of ``pixel_sizes``; else None."""
    parts = steps(transform)
    first = parts[0] if parts else None
    if not vars(type(first)).get("whole_pictures", False) or getattr(first, "targets", None) is not None \
            or getattr(first, "field", None) not in pixel_sizes:
        return None
    height, width = pixel_sizes[first.field]
    return WholePictures(first.field, (int(height), int(width)))


def _split_head(transform: Transform | None, method: str, fields: Collection[str]) -> tuple[Any, Transform | None]:
    """``(first, rest)`` when ``transform`` (or the first step of a `Compose`) has ``method`` and works on
    one of ``fields``, else ``(None, transform)``; ``rest`` is what is left (None for nothing)."""
    parts = steps(transform)
    first = parts[0] if parts else None
    if not (hasattr(first, method) and getattr(first, "field", None) in fields):
        return None, transform
    return first, _composed(transform, parts[1:])


def _split_tail(transform: Transform | None) -> tuple[Transform | None, Transform | None]:
    """``(head, tail)`` of ``transform``: ``tail`` its last steps with ``random = False`` (None for none), a step
    whose own class says how to do the next in the same pass (``then``: `Normalize` then `Cast` to float16) made one.

    >>> from outcore.transforms import Cast, Compose, Normalize, RandomFlip
    >>> _split_tail(Compose([RandomFlip(), Normalize(0.5, 0.2), Cast("float16")]))[1]
    Normalize(mean=0.5, std=0.2, scale=None, field='images', dtype='float16')
    """
    parts = steps(transform)
    cut = len(parts)
    while cut and getattr(parts[cut - 1], "random", True) is False:
        cut -= 1
    tail: list[Any] = []
    for step in parts[cut:]:
        then = vars(type(tail[-1])).get("then") if tail else None
        joined = None if then is None else then(tail[-1], step)
        if joined is None:
            tail.append(step)
        else:
            tail[-1] = joined
    return _composed(transform, parts[:cut]), _composed(transform, tail)


def check_fields(transform: Transform | None, fields: Collection[str]) -> None:
    """An `OptionError` when one of outcore's transforms in ``transform`` works on a field the batches
    do not hold (left out by ``fields=``): said when the loader is made, not at its first batch in a
    DataLoader worker. A transform of the user's is theirs to check."""
    for step in steps(transform):
        if not type(step).__module__.startswith("outcore."):
            continue
        targets = getattr(step, "targets", None)
        wanted = [getattr(step, "field", None), *(() if targets is None else targets.fields)]
        for name in wanted:  # a ragged field's offsets come with it
            if name is not None and name not in fields and name.removesuffix(OFFSETS_SUFFIX) not in fields:
                raise OptionError(f"the transform {step!r} works on field {name!r}, which the batches do not hold "
                                  f"(they hold {sorted(fields)}): add {name!r} to fields= (ds.keras, ds.tf: to x= or "
                                  "y=), or pass field= (targets=) to the transform")


def steps(transform: Transform | None) -> list[Any]:
    """The steps of ``transform``: a `Compose`'s (those of a `Compose` in it too, in order), or itself (none for
    None).

    >>> from outcore.transforms import Compose, Normalize, RandomFlip
    >>> steps(Compose([Compose([RandomFlip()]), Normalize()]))
    [RandomFlip(p=0.5, horizontal=True, vertical=False, field='images', targets=None), Normalize(mean=0.0, std=1.0, scale=None, field='images', dtype='float32')]
    """
    if transform is None:
        return []
    inner = getattr(transform, "transforms", None)
    return [step for part in inner for step in steps(part)] if inner is not None else [transform]


def _composed(like: Transform | None, steps: list[Any]) -> Transform | None:
    """``steps`` as one transform: None, the only step, or a composition of the kind of ``like``."""
    return None if not steps else steps[0] if len(steps) == 1 else type(like)(steps)


@dataclass(frozen=True)
class Recipe:
    """How a batch is made from loaded chunks, decided once per iteration: the ``fields`` (those in
    ``text_fields`` decoded to strings), the `Crop` done as its picture field is decoded or copied out of its
    chunks and the `Flip` right after it (both None when the transform does not open so), and the ``rest`` of
    the transform: its
    steps up to the last that draws from the generator (``per_piece``), and those after (``after``, steps
    with ``random = False``, as `Normalize`: they run once on the joined batch, `make_batch`). The encoded fields
    in ``later`` are left undecoded (``decode="later"``, `outcore.iterate.gather.undecoded`): the crop's boxes
    and the flip's mirrors are drawn as ever, and the batch holds them beside the files.

    >>> from outcore.transforms import Compose, Normalize, RandomFlip
    >>> recipe = Recipe.of(["images"], (), (), Compose([RandomFlip(), Normalize()]))
    >>> recipe.per_piece, recipe.after
    (RandomFlip(p=0.5, horizontal=True, vertical=False, field='images', targets=None), Normalize(mean=0.0, std=1.0, scale=None, field='images', dtype='float32'))
    """

    fields: tuple[str, ...]
    text_fields: frozenset[str]
    transform: Transform | None
    crop: Crop | None = None
    flip: Flip | None = None
    rest: Transform | None = None
    per_piece: Transform | None = None
    after: Transform | None = None
    ragged_fields: frozenset[str] = frozenset()
    later: frozenset[str] = frozenset()

    @classmethod
    def of(cls, fields: Sequence[str], text_fields: Collection[str], picture_fields: Collection[str],
           transform: Transform | None, ragged_fields: Collection[str] = (), later: Collection[str] = (),
           pixel_sizes: Mapping[str, tuple[int, int]] | None = None) -> Recipe:
        """The recipe of ``fields`` with ``transform``; ``picture_fields`` are those a crop may cut while the
        batch is made (encoded pictures, and pixel fields of two axes or more past the sample axis);
        ``ragged_fields`` hold rows and offsets (`outcore.format.ragged`), and so do the encoded fields left
        undecoded, ``later``; ``pixel_sizes``, the (height, width) of the fields among ``picture_fields`` whose
        pictures are all of one size (pixels, and encoded pictures decoded to one size): a plain `RandomFlip` opening
        the transform of one mirrors its pictures as they are copied or decoded (`WholePictures`).

        >>> from outcore.transforms import Compose, Normalize, RandomFlip
        >>> recipe = Recipe.of(["images"], (), ["images"], Compose([RandomFlip(), Normalize()]),
        ...                    pixel_sizes={"images": (32, 32)})
        >>> recipe.crop, recipe.flip is not None, recipe.per_piece
        (WholePictures(field='images', size=(32, 32)), True, None)
        """
        crop, rest = fused_crop(transform, picture_fields)
        if crop is None:
            crop = _whole_pictures(transform, pixel_sizes or {})
        flip = None
        if crop is not None:
            flip, rest = _split_head(rest, "draw", {crop.field})
            check_targets([crop] if flip is None else [crop, flip])
        return cls(tuple(fields), frozenset(text_fields), transform, crop, flip, rest, *_split_tail(rest),
                   frozenset(ragged_fields) | frozenset(later), frozenset(later))

    @property
    def crop_field(self) -> str | None:
        """The picture field cut as the batch is made, if any."""
        return None if self.crop is None else self.crop.field

    @property
    def joinable(self) -> bool:
        """Whether batches of this recipe may be made as one and cut apart, each the same as if made alone: each
        row is made from its own sample and its piece's draws only (no ragged rows, whose offsets start at each
        batch; no targets moved; after the crop and flip done as the batch is made, only steps whose own class
        applies each piece's draws to the joined pieces, `on_joined`, as `BrightnessContrast` and the crops, then
        steps marked ``per_sample``, as `Normalize` and `Cast`, never one that draws or sees a piece or the batch as a
        whole).

        >>> from outcore.transforms import BrightnessContrast, Compose, Normalize, RandomCrop
        >>> Recipe.of(["images"], (), ["images"], Compose([RandomCrop(8), BrightnessContrast(), Normalize()])).joinable
        True
        >>> class Mine(BrightnessContrast): ...
        >>> Recipe.of(["images"], (), ["images"], Compose([RandomCrop(8), Mine()])).joinable
        False
        """
        return (not self.ragged_fields and getattr(self.crop, "targets", None) is None
                and all(on_joined(step) and getattr(step, "targets", None) is None for step in steps(self.per_piece))
                and all(getattr(step, "per_sample", False) for step in steps(self.after)))


def make_batch(recipe: Recipe, samples: np.ndarray, chunk_size: int, keys: np.ndarray, data: Mapping[int, ChunkValues],
               draws: Draws, empty: Empty = plain, spent: Callable[[float], None] | None = None) -> Batch:
    """`assemble` then the transform, piece by piece: ``draws`` holds each piece's ``(samples, key)``
    (`batch_draws`), and each piece of the batch is transformed with a generator of its key, the pieces
    joined in order; the transform's last steps that draw nothing (`Recipe.after`) run once on the joined
    batch. The recipe's `Crop` is done as the batch is made (each box read from the file,
    `EncodedChunk.decode_region`, or copied out of its pixel chunk), with the boxes the crop would have drawn
    on the piece, and so is its `Flip` (each box mirrored as it is cut), so the rest of the transform sees
    the same generator state. The batch's arrays are made by ``empty`` (a Dask worker's go to shared memory:
    `outcore.iterate.shared`); ``spent``, when given, is told the seconds the rest of the transform took."""
    rows = Rows.of(keys, samples, chunk_size)
    if recipe.transform is None:
        return assemble(rows, data, recipe.fields, recipe.text_fields, empty, later=recipe.later)
    per_piece, after = recipe.per_piece, recipe.after
    # made here where the transform draws after its crop; else by the crop's draws, and only if it draws piece by piece
    rngs = None if per_piece is None else [transform_generator(key) for _, key in draws]
    bounds = np.cumsum([0, *(count for count, _ in draws)]).tolist()
    if bounds[-1] != len(samples):
        raise ValueError(f"the pieces {[count for count, _ in draws]} do not add up to the batch's {len(samples)}")
    joined = len(draws) > 1 and per_piece is not None  # the pieces' results joined into new arrays
    returned = empty if after is None else plain  # makes the arrays handed back as they are
    made = plain if joined else returned
    cut = None if recipe.crop is None else _cut(recipe, keys, rows, data, draws, rngs)
    targets = None if cut is None else getattr(recipe.crop, "targets", None)
    if targets is None:
        batch = assemble(rows, data, recipe.fields, recipe.text_fields, made, cut, recipe.later)
    else:  # moved by the same draws (the crop's boxes, the flip's mirrors): what they are cut from, in plain memory
        first = data[int(keys[0])]
        rasters = {name for name in (*targets.label_maps, *targets.pictures)
                   if isinstance(first.get(name), RaggedChunk)}  # cut as the batch is made, like their pictures
        cut_later = {*targets.label_maps, *targets.pictures} - rasters
        batch = assemble(rows, data, recipe.fields, recipe.text_fields,
                         lambda shape, dtype, field="": (plain if field in cut_later else made)(shape, dtype, field=field),
                         cut)
        batch = targets.move(batch, cut.boxes, cut.size, cut.flips, cut.sizes, made, rasters)
    began = time.perf_counter()
    if per_piece is not None:
        batch = _transformed(batch, per_piece, bounds, rngs, recipe.ragged_fields, returned if joined else None)
    batch = batch if after is None else after(batch, None)
    if spent is not None:
        spent(time.perf_counter() - began)
    return batch


def _transformed(batch: Batch, per_piece: Transform, bounds: list[int], rngs: list[np.random.Generator],
                 ragged_fields: Collection[str], into: Empty | None) -> Batch:
    """``per_piece`` on each piece of ``batch`` (samples ``bounds[i]`` to ``bounds[i + 1]``), each with its generator
    of ``rngs``, the results joined into arrays made by ``into`` (None: one piece, as the steps make it). Its first
    steps (a user's own) run on each piece; the steps after them whose own class allows it (`on_joined`) on the pieces
    joined, each piece's draws made from its generator as the step would draw them on the piece, then applied to the
    whole batch at once: a crop and its flip cut every piece's boxes by runs on the pool in one call, where each
    piece's crop, then its flip, copied its pictures, and the pieces were joined after. Pieces that a user's step left
    unlike (in their fields, or a field's sample shape or dtype) run the steps after it piece by piece too."""
    each, at_once = _split_joined(per_piece)
    runs = list(zip(bounds[:-1], bounds[1:], rngs, strict=True))
    if each is not None:
        given = [piece(batch, low, high, ragged_fields) for low, high, _ in runs]
        pieces = [each(part, rng) for part, (_, _, rng) in zip(given, runs, strict=True)]
        joined = _one_batch(pieces, given, batch, ragged_fields, at_once[0].field) if at_once else None
        if joined is None:
            rest = _composed(per_piece, at_once)
            pieces = pieces if rest is None else [rest(part, rng) for part, (_, _, rng) in zip(pieces, runs, strict=True)]
            return pieces[0] if into is None else join(pieces, into, ragged_fields)
        batch, bounds = joined
        runs = list(zip(bounds[:-1], bounds[1:], rngs, strict=True))
    for step, flip in _units(at_once):
        batch = _drawn_and_applied(batch, step, flip, runs)
    return batch if into is None or into is plain else join([batch], into, ragged_fields)


def on_joined(step: object) -> bool:
    """Whether ``step``'s own class lets each piece's draws be applied to the joined batch at once, the result as if
    each piece were transformed alone: it says what it draws for each sample (``sample_draws``, then ``apply_draws``:
    `BrightnessContrast`), or it is a crop whose call cuts its boxes (``cut_boxes``: `RandomCrop`,
    `RandomResizedCrop`, `CenterCrop`, `ScaleJitter`) or a plain flip (``whole_pictures``: `RandomFlip`), their
    targets moved with them.

    >>> from outcore.transforms import BrightnessContrast, RandomFlip, RandomResizedCrop
    >>> class Mine(RandomFlip): ...
    >>> [on_joined(step) for step in (BrightnessContrast(), RandomResizedCrop(8), RandomFlip(), Mine())]
    [True, True, True, False]
    """
    own = vars(type(step))
    return own.get("sample_draws") is not None or own.get("cut_boxes") is not None or own.get("whole_pictures", False)


def _split_joined(transform: Transform) -> tuple[Transform | None, list[Any]]:
    """``(each, at_once)``: ``transform``'s steps up to the last that is not `on_joined` (None for none), and those
    after it."""
    parts = steps(transform)
    cut = len(parts)
    while cut and on_joined(parts[cut - 1]):
        cut -= 1
    return _composed(transform, parts[:cut]), parts[cut:]


def _units(at_once: Sequence[Any]) -> list[tuple[Any, Any]]:
    """``at_once``'s steps as they are applied: ``(crop, flip)`` for a crop and the flip of its field right after it
    (each box mirrored as it is cut), ``(None, flip)`` for a flip alone, ``(step, None)`` for the others."""
    units: list[tuple[Any, Any]] = []
    for step in at_once:
        flips = vars(type(step)).get("whole_pictures", False)
        if flips and units and units[-1][1] is None and vars(type(units[-1][0])).get("cut_boxes") is not None \
                and units[-1][0].field == step.field and units[-1][0].targets == step.targets:
            units[-1] = (units[-1][0], step)
        else:
            units.append((None, step) if flips else (step, None))
    return units


def _drawn_and_applied(batch: Batch, step: Any, flip: Any, runs: Sequence[tuple[int, int, np.random.Generator]]
                       ) -> Batch:
    """``batch`` with ``step`` (and ``flip`` after it) applied, each run ``(low, high, rng)``'s draws made from its
    generator as they would be on that piece alone."""
    if step is not None and vars(type(step)).get("sample_draws") is not None:
        drawn = [step.sample_draws(high - low, rng) for low, high, rng in runs]
        return step.apply_draws(batch, tuple(np.concatenate(each) for each in zip(*drawn, strict=True)))
    field = (step or flip).field
    if field not in batch:
        raise KeyError(f"transform needs field {field!r}; the batch has {sorted(batch)}")
    pictures = batch[field]
    crop = step if step is not None else WholePictures(field, pictures.shape[1:3])
    sizes = np.broadcast_to(np.asarray(pictures.shape[1:3], np.int64), (len(pictures), 2))  # one size, seen n times
    boxes, flips = _drawn_boxes(crop, flip, sizes, runs)
    targets = getattr(crop if step is not None else flip, "targets", None)
    return moved(batch, field, crop.cut_boxes(pictures, boxes, None if flip is None else flips), targets, boxes, flips)


def _one_batch(pieces: Sequence[Batch], given: Sequence[Batch], whole: Batch, ragged_fields: Collection[str],
               field: str) -> tuple[Batch, list[int]] | None:
    """The ``pieces`` (a user's step's of the ``given`` parts of ``whole``) joined, with their bounds in it (the
    lengths of their ``field``): a field of ``whole`` whose every piece is the array its step was given is taken as it
    is, not copied. None where the pieces are unlike: their fields, or a field's sample shape or dtype."""
    first = pieces[0]
    for each in pieces[1:]:
        if each.keys() != first.keys() or not all(_alike(each[name], first[name]) for name in first):
            return None
    if len(pieces) == 1:
        return first, [0, len(first[field])]
    ragged = {name for name in ragged_fields for name in (name, kept_name(name), offsets_name(name))}
    kept = {name for name in first if name not in ragged and name in whole
            and all(each[name] is part.get(name) for each, part in zip(pieces, given, strict=True))}
    rest = join([{name: each[name] for name in first if name not in kept} for each in pieces], plain, ragged_fields)
    return ({name: whole[name] if name in kept else rest[name] for name in first},
            np.cumsum([0, *(len(each[field]) for each in pieces)]).tolist())


def _alike(one: object, other: object) -> bool:
    """Whether two pieces' values of a field may be joined: arrays of one sample shape and dtype (text of any
    width)."""
    if not isinstance(one, np.ndarray) or not isinstance(other, np.ndarray) or one.shape[1:] != other.shape[1:]:
        return False
    return one.dtype == other.dtype or (one.dtype.kind in "US" and one.dtype.kind == other.dtype.kind)


def _cut(recipe: Recipe, keys: np.ndarray, rows: Rows, data: Mapping[int, ChunkValues], draws: Draws,
         rngs: list[np.random.Generator] | None) -> Cut:
    """The recipe's crop (and flip) of each row, as the transform would draw them on each piece of ``draws`` with
    ``rngs``, its generators; without them (nothing draws after the flip), all at once where the crop can
    (`PiecesAtOnce`), else piece by piece with generators made here."""
    crop = recipe.crop
    sources = rows.sources(data, crop.field)
    sizes = picture_sizes(sources, rows.which, rows.local)
    if not one_size(sources):  # in the batch's order
        sizes[rows.order] = sizes.copy()
    at_once = getattr(crop, "boxes_of_pieces", None) if rngs is None else None
    drawn = None if at_once is None else at_once(sizes, draws, recipe.flip)
    if drawn is not None:
        return _cut_of(recipe, *drawn, sizes)
    rngs = rngs if rngs is not None else [transform_generator(key) for _, key in draws]
    bounds = np.cumsum([0, *(count for count, _ in draws)]).tolist()
    try:
        boxes, flips = _drawn_boxes(crop, recipe.flip, sizes, list(zip(bounds[:-1], bounds[1:], rngs, strict=True)))
    except OptionError as error:  # a picture too small for the crop: name it (the pieces before it fit theirs)
        local = np.empty_like(rows.local)
        local[rows.order] = rows.local  # in the batch's order
        raise _too_small(error, crop, [data[key][crop.field] for key in keys.tolist()], local.tolist(),
                         sizes.tolist()) from None
    return _cut_of(recipe, boxes, flips, sizes)


def _drawn_boxes(crop: Crop, flip: Flip | None, sizes: np.ndarray, runs: Sequence[tuple[int, int, np.random.Generator]]
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Each run ``(low, high, rng)``'s boxes of its pictures of ``sizes[low:high]`` (`Crop.boxes`), then ``flip``'s
    mirrors of them, drawn from its generator as on that piece alone: (n, 4) float64 and (n, 2) uint8."""
    boxes = np.empty((len(sizes), 4), np.float64)
    flips = np.zeros((len(sizes), 2), np.uint8)
    for low, high, rng in runs:
        boxes[low:high] = np.asarray(crop.boxes(sizes[low:high], rng), np.float64).reshape(-1, 4)
        if flip is not None:
            flips[low:high] = flip.draw(high - low, rng)
    return boxes, flips


def _cut_of(recipe: Recipe, boxes: np.ndarray, flips: np.ndarray, sizes: np.ndarray) -> Cut:
    """The `Cut` of the recipe's crop by ``boxes`` and ``flips``, of pictures of ``sizes``."""
    crop = recipe.crop
    targets = getattr(crop, "targets", None)
    whole = vars(type(crop)).get("windows", False)  # the crop's own class says so: a subclass may draw other boxes
    if targets is None:
        return Cut(crop.field, crop.output_size, boxes, flips, sizes, whole=whole)
    return Cut(crop.field, crop.output_size, boxes, flips, sizes, frozenset(targets.label_maps), targets.fill, whole)


def _too_small(error: OptionError, crop: Crop, sources: list[Any], indices: list[int],
               sizes: list[list[int]]) -> OptionError:
    """``error`` (the crop cannot cut its box from a picture of ``sizes``), naming the first encoded picture
    it cannot cut from (a pixel field's pictures are all of one size: the error says it)."""
    for source, index, size in zip(sources, indices, sizes, strict=True):
        try:
            crop.boxes([size], np.random.default_rng(0))
        except OptionError:
            return OptionError(f"{source.sample_name(index)}: {error}") if isinstance(source, EncodedChunk) else error
    return error


def piece(batch: Batch, low: int, high: int, ragged_fields: Collection[str] = ()) -> Batch:
    """Samples ``low .. high - 1`` of ``batch`` (views): a ragged field's rows of those samples (and of its kept
    rows' indices, `kept_name`, after a crop), its offsets from 0.

    >>> piece({"x": np.arange(3), "b": np.arange(4), "b_offsets": np.array([0, 1, 3, 4])}, 1, 3, {"b"})
    {'x': array([1, 2]), 'b': array([1, 2, 3]), 'b_offsets': array([0, 2, 3])}
    """
    cut = {}
    offsets = {offsets_name(name) for name in ragged_fields}
    rows = {row: offsets_name(name) for name in ragged_fields for row in (name, kept_name(name))}
    for name, values in batch.items():
        if name in rows:
            bounds = batch[rows[name]]
            cut[name] = values[bounds[low] : bounds[high]]
        elif name in offsets:
            cut[name] = values[low : high + 1] - values[low]
        else:
            cut[name] = values[low:high]
    return cut


def join(pieces: Sequence[Batch], empty: Empty = plain, ragged_fields: Collection[str] = ()) -> Batch:
    """The pieces of a batch, field by field, in order, as one batch (arrays made by ``empty``; text as wide
    as its widest piece; a ragged field's offsets run on across the pieces).

    >>> join([{"x": np.arange(2), "t": np.array(["a"])}, {"x": np.arange(3), "t": np.array(["bcd"])}])
    {'x': array([0, 1, 0, 1, 2]), 't': array(['a', 'bcd'], dtype='<U3')}
    """
    offsets = {offsets_name(name) for name in ragged_fields}
    return {name: joined_offsets([piece[name] for piece in pieces]) if name in offsets else
            join_field([piece[name] for piece in pieces], name, empty) for name in pieces[0]}


def joined_offsets(parts: Sequence[np.ndarray]) -> np.ndarray:
    """Pieces' offsets as the joined batch's: each piece's past the rows of those before it.

    >>> joined_offsets([np.array([0, 2, 3]), np.array([0, 0, 4])]).tolist()
    [0, 2, 3, 3, 7]
    """
    ends = np.cumsum([0, *(int(part[-1]) for part in parts)])
    return np.concatenate([*(part[:-1] + end for part, end in zip(parts, ends, strict=False)), ends[-1:]]).astype(np.int64)


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


def batch_draws(seed: int, epoch: int, step: int, pieces: Sequence[tuple[int, int]]) -> Draws:
    """The ``(samples, key)`` of each piece of a batch at ``step`` (`EpochPlan.pieces`' ``(key, samples)``):
    its augmentation generator's key (`transform_generator`) is the piece's stream and the step, not the rank
    or loader worker that makes it, so a global step is augmented alike on any number of either.

    >>> batch_draws(0, 3, 7, ((2, 32), (3, 32)))
    ((32, (0, 3, 7, 2)), (32, (0, 3, 7, 3)))
    """
    return tuple([(count, (seed, epoch, step, key)) for key, count in pieces])


TRANSFORM_DOMAIN = Domain.TRANSFORM  # the seed domain of a batch's transform


def transform_generator(rng_key: Sequence[int]) -> np.random.Generator:
    """The generator a batch's transform draws from, in the transform's own seed domain."""
    return generator(TRANSFORM_DOMAIN, *rng_key)


def apply_transform(transform: Transform | None, batch: Batch, rng_key: Sequence[int]) -> Batch:
    """``transform(batch, rng)`` with the generator of ``rng_key`` (`transform_generator`)."""
    return batch if transform is None else transform(batch, transform_generator(rng_key))
