"""The fields that move with a picture under a geometric transform: `Targets`.

A crop or flip of ``images`` must cut, resize and mirror its segmentation masks, boxes and keypoints with the
same draw, exactly. Give the geometric transforms (`RandomResizedCrop`, `RandomCrop`, `CenterCrop`,
`RandomFlip`) one ``targets=`` and every draw is applied to all of them (`Targets.move`), whether the crop is
done while the batch is made (fused with decoding) or on a batch in hand. A batch holds them as:

- label maps: arrays (n, h, w[, c]) of integer ids at the picture's size, cut and resized nearest-neighbour
  (no id is ever made or changed; ``fill`` past the picture's edges);
- paired pictures (depth, a second view): arrays at the picture's size, resized like it (bilinear);
- instances: ``boxes`` (m, 4: x0, y0, x1, y1 in the picture's pixels) and ``keypoints`` (m, k, 2 or 3: x, y[,
  visibility]), with more per-instance fields (``instances``: their labels, ``iscrowd``, ...), the values of
  all the batch's pictures back to back: picture ``i`` owns rows ``offsets[i]:offsets[i + 1]`` of each, where
  ``offsets`` is the field ``<boxes>_offsets`` (n + 1,). A crop drops the boxes its `BoxPolicy` says, with
  their rows of every instance field; ``<boxes>_kept`` then says which of the picture's instances each row
  was (its index among the picture's instances before the transform: an instance-id map's id - 1).

>>> import numpy as np
>>> from outcore.transforms import RandomFlip
>>> batch = {"images": np.zeros((1, 4, 4, 3), np.uint8), "masks": np.eye(4, dtype=np.uint8)[None],
...          "boxes": np.array([[0.0, 0.0, 1.0, 1.0]]), "boxes_offsets": np.array([0, 1])}
>>> flipped = RandomFlip(p=1.0, targets=Targets(label_maps=("masks",), boxes="boxes"))(batch, np.random.default_rng(0))
>>> flipped["masks"][0, 0].tolist(), flipped["boxes"].tolist()
([0, 0, 0, 1], [[3.0, 0.0, 4.0, 1.0]])
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import OptionError
from ..format import kept_name, offsets_name
from ..imaging import (
    Box,
    BoxPolicy,
    cut_label_maps,
    move_boxes,
    move_keypoints,
    owners,
)
from ..threads import for_each_run
from .gather import Empty, move_pictures, plain, run_length

Batch = dict[str, np.ndarray]


@dataclass(frozen=True)
class Targets:
    """The fields a geometric transform moves with its picture field (see the module's text for how a batch
    holds each kind). ``flip_pairs`` are the keypoints (left, right indices) that swap places in a mirror
    image; ``policy`` says which boxes a crop keeps; ``fill`` is a label map's value past the picture's edges
    (a padded `RandomCrop`: 255 for Pascal VOC's void).

    >>> Targets(label_maps=("masks",), boxes="boxes", instances=("box_labels",)).fields
    ('masks', 'boxes', 'boxes_offsets', 'box_labels')
    """

    label_maps: tuple[str, ...] = ()
    pictures: tuple[str, ...] = ()
    boxes: str | None = None
    keypoints: str | None = None
    instances: tuple[str, ...] = ()
    flip_pairs: tuple[tuple[int, int], ...] = ()
    policy: BoxPolicy = field(default_factory=BoxPolicy)
    fill: int = 0

    def __post_init__(self) -> None:
        for name in ("label_maps", "pictures", "instances", "flip_pairs"):
            value = getattr(self, name)
            if isinstance(value, str):
                raise OptionError(f"Targets({name}={value!r}): a tuple of names, e.g. {name}=({value!r},)")
            object.__setattr__(self, name, tuple(tuple(pair) if name == "flip_pairs" else pair for pair in value))
        if self.instances and self.group is None:
            raise OptionError(f"Targets(instances={self.instances}): instance fields go with boxes= or keypoints=")

    @property
    def group(self) -> str | None:
        """The field naming the instances' offsets and kept rows: ``boxes``, else ``keypoints``."""
        return self.boxes or self.keypoints

    @property
    def offsets(self) -> str | None:
        """The batch field of the instances' offsets (n + 1,)."""
        return None if self.group is None else offsets_name(self.group)

    @property
    def kept(self) -> str | None:
        """The batch field saying which of its picture's instances each kept row was."""
        return None if self.group is None else kept_name(self.group)

    @property
    def fields(self) -> tuple[str, ...]:
        """Every batch field these targets read."""
        instances = tuple(name for name in (self.boxes, self.keypoints, self.offsets) if name) + self.instances
        return self.label_maps + self.pictures + instances

    def move(self, batch: Batch, crops: np.ndarray, size: tuple[int, int], flips: np.ndarray, sizes: np.ndarray,
             empty: Empty = plain, cut: Collection[str] = ()) -> Batch:
        """``batch`` with every target moved as its picture was: picture ``i`` of ``sizes[i]`` (height, width)
        cut to ``crops[i]`` (top, left, height, width), resized to ``size`` and mirrored as ``flips[i]`` says.
        Label maps and paired pictures are made by ``empty``, but for those in ``cut``, cut already as the batch
        was made (rasters: `outcore.iterate.gather.Cut`); an `OptionError` names a field that is missing or does
        not fit its pictures."""
        crops = np.asarray(crops, np.float64).reshape(-1, 4)
        flips = np.asarray(flips, bool).reshape(-1, 2)
        moved = dict(batch)
        for name in (name for name in self.label_maps if name not in cut):
            maps = self._at_picture_size(batch, name, sizes)
            out = empty((len(maps), *size, *maps.shape[3:]), maps.dtype, field=name)
            for_each_run(lambda start, stop, maps=maps, out=out: cut_label_maps(
                maps[start:stop], crops[start:stop], size, flips[start:stop], self.fill, out[start:stop]),
                len(maps), run_length(out))
            moved[name] = out
        for name in (name for name in self.pictures if name not in cut):
            moved[name] = move_pictures(self._at_picture_size(batch, name, sizes), crops, size, flips)
        if self.group is not None:
            moved.update(self._move_instances(batch, crops, size, flips))
        return moved

    def _at_picture_size(self, batch: Batch, name: str, sizes: np.ndarray) -> np.ndarray:
        values = _field(batch, name)
        if len(sizes) and (values.ndim < 3 or (np.asarray(sizes) != values.shape[1:3]).any()):
            wrong = int(np.argmax((np.asarray(sizes) != values.shape[1:3]).any(axis=1))) if values.ndim >= 3 else 0
            raise OptionError(f"target field {name!r} holds samples of shape {values.shape[1:]}, not at the size of "
                              f"their pictures ({tuple(np.asarray(sizes)[wrong].tolist())} at row {wrong}): a label "
                              "map or paired picture moves with its picture only at the picture's own size")
        return values

    def _move_instances(self, batch: Batch, crops: np.ndarray, size: tuple[int, int], flips: np.ndarray) -> Batch:
        offsets = _offsets(batch, self.offsets, len(crops))
        which = owners(offsets)
        fields = [name for name in (self.boxes, self.keypoints, *self.instances, self.kept) if name in batch]
        for name in fields:
            if len(batch[name]) != offsets[-1]:
                raise OptionError(f"instance field {name!r} has {len(batch[name])} rows, but {self.offsets!r} "
                                  f"counts {offsets[-1]}: each picture's instances are rows offsets[i]:offsets[i + 1]")
        moved: Batch = {}
        keep = np.ones(len(which), bool)
        if self.boxes is not None:
            moved[self.boxes], keep = move_boxes(_field(batch, self.boxes), which, crops, size, flips, self.policy)
        if self.keypoints is not None:
            moved[self.keypoints] = move_keypoints(_field(batch, self.keypoints), which, crops, size, flips,
                                                   self.flip_pairs)
        kept = batch.get(self.kept)
        moved[self.kept] = np.arange(len(which)) - offsets[which] if kept is None else np.asarray(kept, np.int64)
        rows = {name: batch[name] for name in self.instances} | moved
        if not keep.all():
            rows = {name: values[keep] for name, values in rows.items()}
            offsets = np.concatenate([[0], np.cumsum(np.bincount(which[keep], minlength=len(crops)))]).astype(np.int64)
        shared = {offsets_name(name) for name in rows if offsets_name(name) in batch}  # a ragged field's own offsets
        return rows | dict.fromkeys(shared | {self.offsets}, offsets)


def moved(batch: Batch, field: str, values: np.ndarray, targets: Targets | None, crops: np.ndarray | Sequence[Box],
          flips: np.ndarray | None = None) -> Batch:
    """``batch`` with ``field`` replaced by ``values`` (its pictures cut to ``crops``, resized to ``values``' size
    and mirrored as ``flips`` says) and ``targets`` moved alike (`Targets.move`)."""
    if targets is None:
        return {**batch, field: values}
    pictures = batch[field]
    crops = np.asarray(crops, np.float64).reshape(-1, 4)
    flips = np.zeros((len(crops), 2), bool) if flips is None else flips
    sizes = np.tile(np.asarray(pictures.shape[1:3], np.int64), (len(pictures), 1))
    return {**targets.move(batch, crops, values.shape[1:3], flips, sizes), field: values}


def left_right_pairs(points: Sequence[str]) -> tuple[tuple[int, int], ...]:
    """The keypoints a mirror image swaps, from their names (a keypoint field's ``points``,
    ``ds.info("keypoints").points``): each ``left`` name and the ``right`` one it names the other side of, in any
    case, as ``Targets(flip_pairs=...)`` takes them.

    >>> left_right_pairs(["nose", "left_eye", "right_eye", "Left_Hand", "Right_Hand", "left_tail"])
    ((1, 2), (3, 4))
    """
    index = {name: k for k, name in enumerate(points)}
    pairs = []
    for k, name in enumerate(points):
        other = re.sub("left", lambda found: {"left": "right", "Left": "Right", "LEFT": "RIGHT"}.get(found[0], found[0]),
                       name, flags=re.IGNORECASE)
        if other != name and other in index:
            pairs.append((k, index[other]))
    return tuple(pairs)


def _field(batch: Batch, name: str) -> np.ndarray:
    if name not in batch:
        raise OptionError(f"the transform's targets need field {name!r}; the batch has {sorted(batch)}")
    return batch[name]


def _offsets(batch: Batch, name: str, pictures: int) -> np.ndarray:
    """The batch's instance offsets, checked: (pictures + 1,), from 0, never decreasing."""
    offsets = np.asarray(_field(batch, name))
    if offsets.shape != (pictures + 1,) or offsets.dtype.kind not in "iu" or offsets[0] != 0 \
            or (np.diff(offsets) < 0).any():
        raise OptionError(f"field {name!r} is not the offsets of {pictures} pictures' instances: (n + 1,) integers "
                          f"from 0, never decreasing (it is {offsets.dtype} {offsets.shape}, starting "
                          f"{offsets[:3].tolist()})")
    return offsets.astype(np.int64)


def check_targets(steps: Sequence[object]) -> None:
    """An `OptionError` when two geometric steps on one picture field move different targets: a mask cut by the
    crop but not mirrored by the flip would no longer lie under its picture."""
    seen: dict[str, object] = {}
    for step in steps:
        if hasattr(step, "targets") and hasattr(step, "field"):
            first = seen.setdefault(step.field, step)
            if first.targets != step.targets:
                raise OptionError(f"{type(first).__name__} moves targets={first.targets!r} but {type(step).__name__} "
                                  f"moves targets={step.targets!r}: give every geometric step of field {step.field!r} "
                                  "the same targets=, so that the targets move with every draw of the picture")
