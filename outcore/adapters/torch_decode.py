"""PyTorch: the pictures of ``decode="later"`` batches decoded on a device (a GPU's JPEG decoder), cut, resized and
mirrored there: ``ds.torch(..., decode="cuda")``.

The batches come from outcore's readers (threads, DataLoader workers, a Dask cluster) with each picture field's
files undecoded and the boxes its crop drew, as on the CPU path, the same boxes for the same seed
(`outcore.iterate.gather.undecoded`). Here, in the training process, the plain JPEGs of a batch (`plain_jpeg`:
no EXIF) are decoded together by torchvision's ``decode_jpeg`` on the device (nvJPEG on CUDA); any other file
(PNG, WebP, a JPEG with EXIF, which may be turned) by outcore's own decoder, upright, as the CPU path decodes it,
then moved there. Each box is resized to the crop's size by the filter outcore's threads resize with (Pillow's
antialiased bilinear, sub-pixel edges and all: `outcore.imaging.resize.resize_taps`, weighted sums in float64
there) and mirrored; a box past the picture's edges (``RandomCrop``'s padding) leaves zeros there.

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
        channels, dtype = field.decode.channels, torch.from_numpy(np.zeros(0, field.decode.dtype)).dtype
        out = torch.zeros((len(files), *field.size, channels), dtype=dtype, device=self.device)
        sizes = sizes.tolist()
        pictures = self._pictures(name, field, files, sizes, samples)
        placed = []  # (row of the batch, picture, box in the picture's pixels, resized size, where in the row, flip)
        for k, (picture, box, flip) in enumerate(zip(pictures, boxes.tolist(), flips.tolist(), strict=True)):
            sample = tuple(sizes[k])  # the box's picture: the field's shape, or the picture's own size
            if tuple(picture.shape[1:]) != sample and not cut_from_file(files[k].numpy().tobytes(), field.decode):
                picture = fitted(picture, sample, field.decode.resize, self._name(name, samples, k))
            part = box_part(tuple(box), sample, field.size, (bool(flip[0]), bool(flip[1])))
            if part is not None:  # else a window wholly past the picture: zeros
                box, size, where = part
                placed.append((k, picture, in_file(box, tuple(picture.shape[1:]), sample, field.decode.resize), size,
                               where, flip))
        resizes = _resizes([(box, tuple(picture.shape[1:]), size) for _, picture, box, size, _, _ in placed], self.device)
        for (k, picture, box, size, (rows, columns), flip), resize in zip(placed, resizes, strict=True):
            piece = _resized(picture, box, size, resize)
            mirrored = [axis for axis, on in ((2, flip[0]), (1, flip[1])) if on]
            out[k, rows, columns] = (piece.flip(mirrored) if mirrored else piece).permute(1, 2, 0)
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
    if resize == "fit":
        return _resized(picture, (0, 0, height, width), size)
    if resize == "crop":
        top, left, bottom, right = cover_box((height, width), size)
        return _resized(picture, (top, left, bottom - top, right - left), size)
    if resize != "pad":
        raise ImageError(name, f"it is {height}x{width}, the field's pictures {size[0]}x{size[1]}, and its resize policy "
                               "is none: decode it here, leaving decode= out")
    scaled, (top, left) = pad_placement((height, width), size)
    padded = torch.zeros((picture.shape[0], *size), dtype=picture.dtype, device=picture.device)
    padded[:, top : top + scaled[0], left : left + scaled[1]] = _resized(picture, (0, 0, height, width), scaled)
    return padded


def _files(files: Any, offsets: Any) -> list[Any]:
    """The batch's files as views of its bytes (uint8 CPU tensors)."""
    bounds = offsets.tolist()
    return [files[start:stop] for start, stop in itertools.pairwise(bounds)]


def _whole_jpeg(data: Any) -> bool:
    """Whether a file ends as a JPEG does (a truncated one goes to outcore's decoder, which names what is wrong)."""
    return len(data) >= 4 and bytes(data[-2:].numpy()) == b"\xff\xd9"


@dataclass(frozen=True)
class Resize:
    """A box's resize on a device (`_resizes`): the rows and columns of the picture its taps read, and the taps of
    each pass, ``(columns, weights)`` of (size, taps) each (`resize_taps`), on the device."""

    rows: slice
    columns: slice
    across: tuple[Any, Any]
    down: tuple[Any, Any]


def _resizes(boxes: Sequence[tuple[Box, tuple[int, int], tuple[int, int]]], device: Any) -> list[Resize | None]:
    """The `Resize` of each ``(box, picture's size, resized size)`` (top, left, height, width; (h, w); (h, w)), their
    taps sent to ``device`` in two copies for them all (a copy from the host waits for the device: one a box held
    each batch's work to the pace of its copies); None for a box of whole pixels at the size (a plain cut)."""
    planned, columns, weights = [], [], []
    for (top, left, height, width), found, size in boxes:
        if (height, width) == tuple(size) and float(top).is_integer() and float(left).is_integer():
            planned.append(None)
            continue
        y0, rows, *down = resize_taps(top, top + height, found[0], size[0])
        x0, span, *across = resize_taps(left, left + width, found[1], size[1])
        planned.append((slice(y0, y0 + rows), slice(x0, x0 + span), len(columns)))
        columns += [across[0], down[0]]
        weights += [across[1], down[1]]
    if not columns:
        return planned
    sent = [torch.from_numpy(np.concatenate([taps.ravel() for taps in parts])).to(device) for parts in (columns, weights)]
    views, at = [], 0
    for taps in columns:
        views.append(tuple(flat[at : at + taps.size].view(taps.shape) for flat in sent))
        at += taps.size
    return [plan if plan is None else Resize(plan[0], plan[1], views[plan[2]], views[plan[2] + 1]) for plan in planned]


def _resized(picture: Any, box: Box, size: tuple[int, int], resize: Resize | None = None) -> Any:
    """``box`` (top, left, height, width) of ``picture`` (C, H, W) resized to ``size`` as outcore's threads resize it:
    Pillow's antialiased bilinear filter, columns first, then rows, rounded between (`resize_taps`), each output
    pixel its taps' weighted sum in float64 on the picture's device (exact: the C extension's fixed-point sums), by
    the taps of ``resize`` (`_resizes`; made here without). A box of whole pixels at the size is its pixels."""
    top, left, height, width = box
    if (height, width) == tuple(size) and float(top).is_integer() and float(left).is_integer():
        return picture[:, int(top) : int(top) + size[0], int(left) : int(left) + size[1]]
    resize = resize or _resizes([(box, tuple(picture.shape[1:]), size)], picture.device)[0]
    region = picture[:, resize.rows, resize.columns].to(torch.float64)
    resized = _rounded(_tapped(region, *resize.across), picture.dtype)  # (C, rows, width)
    return _rounded(_tapped(resized.transpose(1, 2), *resize.down), picture.dtype).transpose(1, 2).to(picture.dtype)


def _tapped(lines: Any, columns: Any, weights: Any) -> Any:
    """Each line of ``lines`` (..., span) resized by its taps (``columns`` and ``weights`` (size, taps), on the
    lines' device): (..., size), the weighted sums of the pixels each output pixel reads."""
    return (lines[..., columns] * weights).sum(dim=-1)


def _rounded(values: Any, dtype: Any) -> Any:
    """Sums of an integer picture's pixels rounded half up and held to its dtype's range (a float one's as they are)."""
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
