"""PyTorch: the pictures of ``decode="later"`` batches decoded on a device (a GPU's JPEG decoder), cut, resized and
mirrored there: ``ds.torch(..., decode="cuda")``.

The batches come from outcore's readers (threads, DataLoader workers, a Dask cluster) with each picture field's
files undecoded and the boxes its crop drew, as on the CPU path, the same boxes for the same seed
(`outcore.iterate.gather.undecoded`). Here, in the training process, the plain JPEGs of a batch (`plain_jpeg`:
no EXIF) are decoded together by torchvision's ``decode_jpeg`` on the device (nvJPEG on CUDA); any other file
(PNG, WebP, a JPEG with EXIF, which may be turned) by outcore's own decoder, upright, as the CPU path decodes it,
then moved there. Each box is resized to the crop's size by the filter outcore's threads resize with (Pillow's
antialiased bilinear, sub-pixel edges and all: `outcore.imaging.resize.resize_taps`, weighted sums in float64
there) and mirrored; a box past the picture's edges (``RandomCrop``'s padding) leaves zeros there. A batch's
boxes are cut together, whatever their pictures' sizes, as two matrix products a group of pictures
(`cut_together`): a few dozen calls a batch on the device, not a dozen a picture.

Pixels are the CPU path's where the decoders give the same pixels (outcore's own, ``decode="cpu"``, for
pictures the CPU path decodes whole); they differ where the CPU path decodes a large picture at a reduced DCT
scale (1/2, 1/4, 1/8) for a small crop, and by nvJPEG's own IDCT and upsampling: `benchmarks/device/gpu_decode.py`
measures how far, and tests/test_torch_decode.py bounds it on the CPU.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ImageError, OptionError, OutcoreWarning, SampleDecodeError
from ..format import ImageDecode, offsets_name, undecoded_names
from ..imaging import Box, box_part, cut_from_file, decode_image, plain_jpeg, policy_crop, resize_taps
from ..imaging.resize import cover_box, pad_placement
from ..iterate import recipe
from .torch_module import torch

Decoder = Callable[[list[Any], int], list[Any]]  # (files as uint8 CPU tensors, channels) -> (C, H, W) tensors


@dataclass(frozen=True)
class Undecoded:
    """A picture field a batch holds undecoded: the size its boxes are resized to and how it decodes."""

    size: tuple[int, int]
    decode: ImageDecode


class DeviceDecoder:
    """Decodes the undecoded picture ``fields`` of each batch on ``device`` into ``(n, H, W, C)`` tensors there
    (``(n, C, H, W)`` views with ``channels_first``), in place of their files and the boxes beside them; the
    other fields are left as they are. ``decoder`` decodes a list of plain JPEGs: torchvision's ``decode_jpeg``
    on ``device`` by default (`torchvision_decoder`), else outcore's decoder (`host_decoder`), which any
    device takes (a CPU one: to try a pipeline without a GPU).

    >>> decoder = DeviceDecoder({"images": Undecoded((224, 224), ImageDecode((None, None, 3)))}, "cuda")  # doctest: +SKIP
    >>> batch = decoder(batch)  # doctest: +SKIP
    """

    def __init__(self, fields: Mapping[str, Undecoded], device: str | Any, channels_first: bool = False,
                 decoder: Decoder | None = None, location: str = "") -> None:
        self.fields, self.device, self.channels_first = dict(fields), torch.device(device), channels_first
        self.decoder = decoder if decoder is not None else default_decoder(self.device)
        self.location = location

    def __call__(self, batch: Any) -> Any:
        samples = getattr(batch, "samples", None)
        for name, field in self.fields.items():
            files, offsets = batch.pop(name), batch.pop(offsets_name(name))
            boxes, flips, sizes = (batch.pop(key) for key in undecoded_names(name))
            batch[name] = self._decoded(name, field, _files(files, offsets), boxes, flips, sizes, samples)
        return batch

    def _decoded(self, name: str, field: Undecoded, files: list[Any], boxes: Any, flips: Any, sizes: Any,
                 samples: Any) -> Any:
        sizes = sizes.tolist()
        pictures = self._pictures(name, field, files, sizes, samples)
        cuts: list[Cut | None] = []  # each row's: None for a window wholly past its picture (zeros)
        for k, (picture, box, flip) in enumerate(zip(pictures, boxes.tolist(), flips.tolist(), strict=True)):
            sample = tuple(sizes[k])  # the box's picture: the field's shape, or the picture's own size
            if tuple(picture.shape[1:]) != sample and not cut_from_file(files[k].numpy().tobytes(), field.decode):
                picture = pictures[k] = fitted(picture, sample, field.decode.resize, self._name(name, samples, k))
            mirrored = (bool(flip[0]), bool(flip[1]))
            part = box_part(tuple(box), sample, field.size, mirrored)
            cuts.append(None if part is None else Cut(
                in_file(part[0], tuple(picture.shape[1:]), sample, field.decode.resize), part[1], part[2], mirrored))
        dtype = torch.from_numpy(np.zeros(0, field.decode.dtype)).dtype
        out = torch.zeros((len(files), *field.size, field.decode.channels), dtype=dtype, device=self.device)
        cut_together(pictures, cuts, out.permute(0, 3, 1, 2))  # written through the view: (n, H, W, C) made
        if len(field.decode.shape) == 2:  # a field of grey pictures without a channel axis, as the CPU path gives it
            return out[..., 0]
        return out.permute(0, 3, 1, 2) if self.channels_first else out

    def _pictures(self, name: str, field: Undecoded, files: list[Any], sizes: list[list[int]],
                  samples: Any) -> list[Any]:
        """Each file decoded on the device, (C, H, W): the plain JPEGs by the decoder, together; the others by
        outcore's decoder. A picture kept at its own size (a field of pictures of one size: of any, fitted to it
        by `in_file`) not of the size the store gives it is a `SampleDecodeError` naming it."""
        plain = [k for k, data in enumerate(files) if plain_jpeg(data.numpy()) and _whole_jpeg(data)]
        pictures: list[Any] = [None] * len(files)
        try:
            decoded = self.decoder([files[k] for k in plain], field.decode.channels) if plain else []
        except Exception as error:  # noqa: BLE001 - a file it refused: each decoded by outcore, which names a damaged one
            warnings.warn(OutcoreWarning(
                f"{self.location}: field {name!r}: the decoder on {self.device} refused this batch's JPEGs "
                f"({type(error).__name__}: {error}); outcore decodes them on the CPU instead"), stacklevel=2)
            plain, decoded = [], []
        for k, picture in zip(plain, decoded, strict=True):
            pictures[k] = picture.to(self.device)
        for k in sorted(set(range(len(files))) - set(plain)):
            pictures[k] = _host_picture(files[k], sizes[k], field.decode, self._name(name, samples, k)).to(self.device)
        for k, (picture, size) in enumerate(zip(pictures, sizes, strict=True)):
            if (field.decode.variable and list(picture.shape[1:]) != size) or picture.shape[0] != field.decode.channels:
                raise SampleDecodeError(
                    f"{self._name(name, samples, k)}: decoded on {self.device} to {tuple(picture.shape[1:])} with "
                    f"{picture.shape[0]} channels, but the store gives it {tuple(size)} with "
                    f"{field.decode.channels}: its file is not the picture the store recorded (outcore verify "
                    "checks a store); decode it here, leaving decode= out")
        return pictures

    def _name(self, field: str, samples: Any, k: int) -> str:
        sample = f"sample {int(samples[k])}" if samples is not None else f"row {k} of the batch"
        return f"{self.location}: field {field!r}, {sample}"


def in_file(box: Box, found: tuple[int, int], sample: tuple[int, int], resize: str | None) -> Box:
    """``box`` of a sample of ``sample`` size (h, w) in the pixels of its file, of ``found`` size, which the
    field's ``resize`` policy fits to the sample (`policy_crop`: the centre that covers it, all of it, or
    past its edges for ``pad``).

    >>> in_file((0, 0, 16, 16), (40, 60), (32, 32), "crop")
    (0.0, 10.0, 20.0, 20.0)
    >>> in_file((1, 2, 3, 4), (32, 32), (32, 32), "crop")
    (1, 2, 3, 4)
    """
    if found == sample:
        return box
    top, left, height, width = policy_crop(found, sample, resize or "crop")
    sy, sx = height / sample[0], width / sample[1]
    return top + box[0] * sy, left + box[1] * sx, box[2] * sy, box[3] * sx


def fitted(picture: Any, size: tuple[int, int], resize: str | None, name: str) -> Any:
    """``picture`` (C, H, W) fitted to ``size`` by the field's ``resize`` policy as `outcore.imaging.fit` fits it:
    resized whole (``fit``), its centre covering it (``crop``), or resized within it and padded with zeros
    (``pad``); no policy is an `ImageError` naming the sample."""
    height, width = picture.shape[1:]
    whole = (slice(0, size[0]), slice(0, size[1]))
    if resize == "fit":
        cut = Cut((0, 0, height, width), size, whole)
    elif resize == "crop":
        top, left, bottom, right = cover_box((height, width), size)
        cut = Cut((top, left, bottom - top, right - left), size, whole)
    elif resize == "pad":
        scaled, (top, left) = pad_placement((height, width), size)
        cut = Cut((0, 0, height, width), scaled, (slice(top, top + scaled[0]), slice(left, left + scaled[1])))
    else:
        raise ImageError(name, f"it is {height}x{width}, the field's pictures {size[0]}x{size[1]}, and its resize policy "
                               "is none: decode it here, leaving decode= out")
    out = torch.zeros((1, picture.shape[0], *size), dtype=picture.dtype, device=picture.device)
    return cut_together([picture], [cut], out)[0]


def _files(files: Any, offsets: Any) -> list[Any]:
    """The batch's files as views of its bytes (uint8 CPU tensors)."""
    bounds = offsets.tolist()
    return [files[start:stop] for start, stop in itertools.pairwise(bounds)]


def _whole_jpeg(data: Any) -> bool:
    """Whether a file ends as a JPEG does (a truncated one goes to outcore's decoder, which names what is wrong)."""
    return len(data) >= 4 and bytes(data[-2:].numpy()) == b"\xff\xd9"


@dataclass(frozen=True)
class Cut:
    """What one picture of a batch is made of (`cut_together`): ``box`` (top, left, height, width) of its decoded
    picture, in that picture's pixels, resized to ``size`` and put at ``where`` (rows, columns) of the output,
    mirrored as ``flip`` (left-right, top-bottom) says; zeros elsewhere."""

    box: Box
    size: tuple[int, int]
    where: tuple[slice, slice]
    flip: tuple[bool, bool] = (False, False)


TOGETHER_BYTES = 256 << 20  # the float64 pixels of the pictures cut at once: a batch's in groups of about this much


def cut_together(pictures: Sequence[Any], cuts: Sequence[Cut | None], out: Any) -> Any:
    """Each picture (C, H, W) cut as its `Cut` says (None: nothing) into its row of ``out`` (n, C, H, W), zeros on the
    device its pictures are on (a view of other memory is written through), and ``out`` returned, as outcore's threads
    resize (Pillow's antialiased bilinear filter, sub-pixel edges and all, columns first, then rows, rounded between:
    `resize_taps`), in a few calls for a whole group of pictures whatever their sizes: the boxes' pixels are gathered
    into a group's array in one index of all the pictures' pixels (`Places`: a box smaller than the group's largest
    padded with its last row and column, which the taps weigh 0), then multiplied by two matrices a picture, its
    taps across and down (placed at
    the rows and columns the cut fills, mirrored as it is; zero elsewhere). The sums are in float64, and exact:
    the taps are the C extension's fixed-point weights, so the order a device sums in changes nothing.

    >>> picture = torch.arange(16, dtype=torch.uint8).reshape(1, 4, 4)
    >>> cut = Cut((1, 1, 2, 2), (2, 2), (slice(0, 2), slice(0, 2)), (True, False))
    >>> cut_together([picture], [cut], torch.zeros((1, 1, 2, 3), dtype=torch.uint8))[0, 0].tolist()  # mirrored, wider
    [[6, 5, 0], [10, 9, 0]]
    """
    channels, size, dtype, device = out.shape[1], tuple(out.shape[2:]), out.dtype, out.device
    filled = [k for k, cut in enumerate(cuts) if cut is not None]  # the rows of the batch a cut fills
    if not filled:
        return out
    made = [cuts[k] for k in filled]
    heights, widths = zip(*(tuple(pictures[k].shape[1:]) for k in filled), strict=True)
    down = _axis_taps([(cut.box[0], cut.box[2], cut.size[0], cut.where[0], cut.flip[1]) for cut in made], heights,
                      size[0])
    across = _axis_taps([(cut.box[1], cut.box[3], cut.size[1], cut.where[1], cut.flip[0]) for cut in made], widths,
                        size[1])
    order = sorted(range(len(filled)), key=lambda j: down.span[j] * across.span[j])  # alike boxes padded alike
    filled, down, across = [filled[j] for j in order], down.taken(order), across.taken(order)
    (down_columns, down_weights), (across_columns, across_weights) = _sent((down, across), device)
    flat = [_in_memory_order(pictures[k]) for k in filled]
    pixels = torch.cat([picture.reshape(-1) for picture, _ in flat])  # every picture's, one after the other
    places = _places([picture for _, picture in flat], down, across, device)
    for part in _groups(list(zip(down.span, across.span, strict=True)), channels):
        spans = max(down.span[part]), max(across.span[part])  # the group's largest box: its regions padded to it
        region = pixels[places.of(part, channels, spans)].to(torch.float64)
        downs = torch.zeros((*down_columns[part].shape[:2], spans[0]), dtype=torch.float64, device=device)
        acrosses = torch.zeros((*across_columns[part].shape[:2], spans[1]), dtype=torch.float64, device=device)
        downs.scatter_add_(2, down_columns[part], down_weights[part])  # a padded tap adds 0 to column 0
        acrosses.scatter_add_(2, across_columns[part], across_weights[part])
        resized = _rounded(torch.matmul(region, acrosses.transpose(1, 2).unsqueeze(1)), dtype)  # (n, C, rows, width)
        out[filled[part]] = _rounded(torch.matmul(downs.unsqueeze(1), resized), dtype).to(dtype)  # (n, C, height, width)
    return out


class Places:
    """Where the boxes of a batch's pictures lie in their pixels put one after the other (`cut_together`), on the
    device, each (n, 1, 1, 1): each picture's start there and its strides (channel, row, column), and each box's
    first row and column and its rows and columns."""

    def __init__(self, values: Any) -> None:
        (self.start, self.channel, self.row, self.column, self.top, self.left, self.height,
         self.width) = values[:, :, None, None, None]

    def of(self, part: slice, channels: int, spans: tuple[int, int]) -> Any:
        """The index of each pixel of the boxes of ``part`` in the pictures' pixels, ``(n, channels, *spans)``: a box
        of fewer rows or columns repeats its last (the taps weigh those 0)."""
        device = self.start.device
        down = torch.minimum(torch.arange(spans[0], device=device).view(1, 1, -1, 1), self.height[part] - 1)
        across = torch.minimum(torch.arange(spans[1], device=device).view(1, 1, 1, -1), self.width[part] - 1)
        channel = torch.arange(channels, device=device).view(1, -1, 1, 1) * self.channel[part]
        return (self.start[part] + channel + (self.top[part] + down) * self.row[part]
                + (self.left[part] + across) * self.column[part])


def _in_memory_order(picture: Any) -> tuple[Any, Any]:
    """``(its pixels in the order of its memory, picture)``: ``picture`` (C, H, W) permuted so that it is contiguous
    (a decoder's (H, W, C) memory seen as (C, H, W) is not copied); a copy of it where no order is."""
    order = sorted(range(picture.ndim), key=lambda axis: -picture.stride(axis))
    if not picture.permute(order).is_contiguous():
        picture = picture.contiguous()
        order = list(range(picture.ndim))
    return picture.permute(order), picture


def _places(pictures: Sequence[Any], down: AxisTaps, across: AxisTaps, device: Any) -> Places:
    """The `Places` of ``pictures`` (C, H, W), their pixels put one after the other in the order of their memory,
    cut as ``down`` and ``across`` say: sent in one copy."""
    sizes = np.array([picture.numel() for picture in pictures], np.int64)
    strides = np.array([picture.stride() for picture in pictures], np.int64).reshape(-1, 3).T
    values = np.stack([np.cumsum(sizes) - sizes, *strides, down.first, across.first, down.span, across.span])
    return Places(torch.from_numpy(values.astype(np.int64)).to(device))


def _groups(spans: Sequence[tuple[int, int]], channels: int) -> list[slice]:
    """Consecutive cuts, each reading ``spans`` (rows, columns) of its picture (smallest first), in groups cut at once:
    as many as hold about `TOGETHER_BYTES` of float64 pixels padded to the group's largest (one at least).

    >>> _groups([(10, 10), (20, 10), (2_000, 4_000)], 3)
    [slice(0, 2, None), slice(2, 3, None)]
    """
    groups, start, rows, columns = [], 0, 0, 0
    for j, (height, width) in enumerate(spans):
        rows, columns = max(rows, height), max(columns, width)
        if j > start and (j + 1 - start) * channels * rows * columns * 8 > TOGETHER_BYTES:
            groups.append(slice(start, j))
            start, rows, columns = j, height, width
    return [*groups, slice(start, len(spans))]


@dataclass(frozen=True)
class AxisTaps:
    """Cuts' resizes along one axis: the lines of its picture each reads (``first`` on, ``span`` of them: (n,)), and
    for each line of the output, ``columns`` (counted from ``first``) and ``weights`` (n, lines, taps): zero
    weights for the output's lines a cut leaves empty."""

    first: list[int]
    span: list[int]
    columns: np.ndarray
    weights: np.ndarray

    def taken(self, order: Sequence[int]) -> AxisTaps:
        """The taps of the cuts in ``order``."""
        return AxisTaps([self.first[j] for j in order], [self.span[j] for j in order], self.columns[order],
                        self.weights[order])


def _axis_taps(cuts: Sequence[tuple[float, float, int, slice, bool]], limits: Sequence[int], lines: int) -> AxisTaps:
    """The taps of ``cuts`` along an axis, each ``(start, length, size, where, mirrored)``: ``[start, start +
    length)`` of its picture's axis of ``limits`` pixels resized to ``size`` and put at ``where`` of an output of
    ``lines`` (``mirrored``: in reverse order); found together for the cuts of one size (a batch's, mostly)."""
    first, span = np.zeros(len(cuts), np.int64), np.zeros(len(cuts), np.int64)
    found: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (cuts, columns, weights) of each size
    for size in sorted({cut[2] for cut in cuts}):
        chosen = np.array([k for k, cut in enumerate(cuts) if cut[2] == size])
        starts = np.array([cuts[k][0] for k in chosen], np.float64)
        ends = starts + np.array([cuts[k][1] for k in chosen], np.float64)
        first[chosen], span[chosen], columns, weights = resize_taps(starts, ends, np.asarray(limits)[chosen], size)
        found.append((chosen, columns, weights))
    taps = max(columns.shape[2] for _, columns, _ in found)
    columns, weights = np.zeros((len(cuts), lines, taps), np.int64), np.zeros((len(cuts), lines, taps))
    for chosen, some_columns, some_weights in found:
        size, count = some_columns.shape[1:]
        at = np.array([_placed_lines(cuts[k][3], size, cuts[k][4]) for k in chosen])  # (cuts, size): output lines
        columns[chosen[:, None], at, :count], weights[chosen[:, None], at, :count] = some_columns, some_weights
    return AxisTaps(first.tolist(), span.tolist(), columns, weights)


def _placed_lines(where: slice, size: int, mirrored: bool) -> np.ndarray:
    """The output lines of a cut's ``size`` lines put at ``where``, in its order (``mirrored``: reversed)."""
    lines = np.arange(where.start, where.start + size)
    return lines[::-1] if mirrored else lines


def _sent(axes: Sequence[AxisTaps], device: Any) -> list[tuple[Any, Any]]:
    """Each axis' taps, ``(columns, weights)``, on ``device``, in two copies for them all (a copy from the host waits
    for the device: two a picture would hold the batch's work to the pace of its copies)."""
    columns, weights = (torch.from_numpy(np.concatenate([getattr(axis, name).ravel() for axis in axes])).to(device)
                        for name in ("columns", "weights"))
    bounds = itertools.pairwise(np.cumsum([0, *(axis.columns.size for axis in axes)]).tolist())
    return [(columns[low:high].view(axis.columns.shape), weights[low:high].view(axis.columns.shape))
            for axis, (low, high) in zip(axes, bounds, strict=True)]


def _rounded(values: Any, dtype: Any) -> Any:
    """Sums of pixels of an integer ``dtype`` rounded half up and held to its range (of a float one, as they are)."""
    if dtype.is_floating_point:
        return values
    return values.add_(0.5).floor_().clamp_(0, torch.iinfo(dtype).max)


def _host_picture(data: Any, size: Sequence[int], decode: ImageDecode, name: str) -> Any:
    """A file outcore decodes here, upright, as (C, H, W) of ``size``: fitted to it by the field's policy (a picture
    kept at its own size is not fitted: another size is its `ImageError`, as on the CPU path)."""
    pixels = decode_image(data.numpy().tobytes(), (*size, decode.channels), None if decode.variable else decode.resize,
                          np.dtype(decode.dtype), name=name)
    return _channels_first(pixels, decode.channels)


def host_decoder(files: list[Any], channels: int) -> list[Any]:
    """Plain JPEGs decoded by outcore's decoder (libjpeg-turbo), one by one, on the CPU, as (C, H, W) uint8."""
    return [_channels_first(decode_image(data.numpy().tobytes(), (None, None, channels), "crop", np.dtype(np.uint8)),
                            channels) for data in files]


def _channels_first(pixels: np.ndarray, channels: int) -> Any:
    """Decoded pixels ((H, W) or (H, W, C)) as a (C, H, W) tensor of their own memory (decoders may hand back
    read-only arrays)."""
    return torch.from_numpy(np.array(pixels.reshape(*pixels.shape[:2], channels))).permute(2, 0, 1)


def torchvision_decoder(device: Any) -> Decoder:
    """Plain JPEGs decoded together by torchvision's ``decode_jpeg`` on ``device`` (nvJPEG on CUDA)."""
    from torchvision.io import ImageReadMode, decode_jpeg

    def decode(files: list[Any], channels: int) -> list[Any]:
        mode = ImageReadMode.RGB if channels == 3 else ImageReadMode.GRAY
        pictures = decode_jpeg([data.contiguous() for data in files], mode=mode, device=device)
        torch.cuda.current_stream(device).synchronize()  # done with the files (pinned memory, reused once freed)
        return pictures

    return decode


def device_decoder(store: Any, fields: Sequence[str] | None, transform: Any, device: str,
                   channels_first: bool) -> DeviceDecoder:
    """The `DeviceDecoder` of ``decode=device`` batches of ``fields`` of ``store`` made with ``transform``: every
    encoded picture field, resized to its crop's size (its own where no crop opens the transform)."""
    try:
        where = torch.device(device)
    except (RuntimeError, TypeError):
        raise OptionError(f"decode={device!r}: say 'here' (decoded as the batches are made), 'later' (the files "
                          "left to you) or a torch device to decode on ('cuda', 'cuda:1', 'cpu')") from None
    made = recipe(store, list(fields) if fields is not None else list(store.fields), transform, "later")
    undecoded = {name: Undecoded(made.crop.output_size if name == made.crop_field else
                                 tuple(store.info(name).decode.shape[:2]), store.info(name).decode)
                 for name in made.later}
    return DeviceDecoder(undecoded, where, channels_first, location=str(store.location))


def default_decoder(device: Any) -> Decoder:
    """torchvision's on a CUDA device (an `OptionError` saying what to install where it is missing), outcore's on
    any other."""
    if device.type != "cuda":
        return host_decoder
    if not torch.cuda.is_available():
        raise OptionError(f"decode={str(device)!r}: torch sees no CUDA device here (torch.cuda.is_available() is "
                          "False): leave decode= out to decode on the CPU")
    try:
        return torchvision_decoder(device)
    except ImportError:
        raise OptionError(f"decode={str(device)!r} decodes JPEGs with torchvision's decode_jpeg (nvJPEG): install "
                          "torchvision built for this torch, or leave decode= out to decode on the CPU") from None
