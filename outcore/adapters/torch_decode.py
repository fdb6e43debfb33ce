"""PyTorch: the pictures of ``decode="later"`` batches decoded on a device (a GPU's JPEG decoder), cut, resized and
mirrored there: ``ds.torch(..., decode="cuda")``.

The batches come from outcore's readers (threads, DataLoader workers, a Dask cluster) with each picture field's
files undecoded and the boxes its crop drew, as on the CPU path, the same boxes for the same seed
(`outcore.iterate.gather.undecoded`). Here, in the training process, the plain JPEGs of a batch (`plain_jpeg`:
no EXIF) are decoded together by torchvision's ``decode_jpeg`` on the device (nvJPEG on CUDA); any other file
(PNG, WebP, a JPEG with EXIF, which may be turned) by outcore's own decoder, upright, as the CPU path decodes it,
then moved there. Each box is resized to the crop's size (bilinear, antialiased, as torchvision's
``resized_crop`` does on tensors) and mirrored; a box past the picture's edges (``RandomCrop``'s padding) leaves
zeros there. Sub-pixel box edges (``CenterCrop(resize=)``, ``ScaleJitter``) are rounded to whole pixels.

Pixels differ from the CPU path's by the resampling (libjpeg-turbo's DCT scaling and outcore's resize against
a full decode and torch's): `benchmarks/device/gpu_decode.py` measures how far, and tests/test_torch_decode.py
bounds it on the CPU.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import OptionError, SampleDecodeError
from ..format import ImageDecode, offsets_name, undecoded_names
from ..imaging import box_part, decode_image, plain_jpeg
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
        pictures = self._pictures(name, field, files, sizes.tolist(), samples)
        for k, (picture, box, flip) in enumerate(zip(pictures, boxes.tolist(), flips.tolist(), strict=True)):
            part = box_part(tuple(box), tuple(picture.shape[1:]), field.size, (bool(flip[0]), bool(flip[1])))
            if part is None:  # a window wholly past the picture: zeros
                continue
            (top, left, height, width), size, (rows, columns) = part
            top, left = round(top), round(left)
            piece = _resized(picture[:, top : top + max(1, round(height)), left : left + max(1, round(width))], size)
            mirrored = [axis for axis, on in ((2, flip[0]), (1, flip[1])) if on]
            out[k, rows, columns] = (piece.flip(mirrored) if mirrored else piece).permute(1, 2, 0)
        return out.permute(0, 3, 1, 2) if self.channels_first else out

    def _pictures(self, name: str, field: Undecoded, files: list[Any], sizes: list[list[int]],
                  samples: Any) -> list[Any]:
        """Each file decoded on the device, (C, H, W): the plain JPEGs by the decoder, together; the others by
        outcore's decoder. A picture not of the size the store gives it is a `SampleDecodeError` naming it."""
        plain = [k for k, data in enumerate(files) if plain_jpeg(data.numpy()) and _whole_jpeg(data)]
        pictures: list[Any] = [None] * len(files)
        try:
            decoded = self.decoder([files[k] for k in plain], field.decode.channels) if plain else []
        except Exception:  # noqa: BLE001 - a file it refused: each decoded by outcore, which names a damaged one
            plain, decoded = [], []
        for k, picture in zip(plain, decoded, strict=True):
            pictures[k] = picture.to(self.device)
        for k in sorted(set(range(len(files))) - set(plain)):
            pictures[k] = _host_picture(files[k], sizes[k], field.decode, self._name(name, samples, k)).to(self.device)
        for k, (picture, size) in enumerate(zip(pictures, sizes, strict=True)):
            if list(picture.shape[1:]) != size or picture.shape[0] != field.decode.channels:
                raise SampleDecodeError(
                    f"{self._name(name, samples, k)}: decoded on {self.device} to {tuple(picture.shape[1:])} with "
                    f"{picture.shape[0]} channels, but the store gives it {tuple(size)} with "
                    f"{field.decode.channels}: its file is not the picture the store recorded (outcore verify "
                    "checks a store); decode it here, leaving decode= out")
        return pictures

    def _name(self, field: str, samples: Any, k: int) -> str:
        sample = f"sample {int(samples[k])}" if samples is not None else f"row {k} of the batch"
        return f"{self.location}: field {field!r}, {sample}"


def _files(files: Any, offsets: Any) -> list[Any]:
    """The batch's files as views of its bytes (uint8 CPU tensors)."""
    bounds = offsets.tolist()
    return [files[start:stop] for start, stop in itertools.pairwise(bounds)]


def _whole_jpeg(data: Any) -> bool:
    """Whether a file ends as a JPEG does (a truncated one goes to outcore's decoder, which names what is wrong)."""
    return len(data) >= 4 and bytes(data[-2:].numpy()) == b"\xff\xd9"


def _resized(picture: Any, size: tuple[int, int]) -> Any:
    """``picture`` (C, H, W) resized to ``size`` as torchvision resizes tensors: bilinear, antialiased, rounded."""
    if tuple(picture.shape[1:]) == tuple(size):
        return picture
    resized = torch.nn.functional.interpolate(picture[None].float(), size=size, mode="bilinear", antialias=True,
                                              align_corners=False)[0]
    if picture.dtype.is_floating_point:
        return resized.to(picture.dtype)
    return resized.round_().clamp_(0, torch.iinfo(picture.dtype).max).to(picture.dtype)


def _host_picture(data: Any, size: Sequence[int], decode: ImageDecode, name: str) -> Any:
    """A file outcore decodes here, upright and of its stored ``size``, as (C, H, W)."""
    pixels = decode_image(data.numpy().tobytes(), (*size, decode.channels), decode.resize or "crop",
                          np.dtype(decode.dtype), name=name)  # its size: fitted to nothing
    return torch.from_numpy(np.array(pixels.reshape(*size, decode.channels))).permute(2, 0, 1)


def host_decoder(files: list[Any], channels: int) -> list[Any]:
    """Plain JPEGs decoded by outcore's decoder (libjpeg-turbo), one by one, on the CPU, as (C, H, W) uint8."""
    return [torch.from_numpy(np.array(decode_image(data.numpy().tobytes(), (None, None, channels), "crop",
                                                   np.dtype(np.uint8)))).permute(2, 0, 1) for data in files]


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
