"""Pictures decoded by the consumer: `decode="later"` batches (each file with the box its crop drew) and
`ds.torch(decode=device)` against the CPU path: windows byte for byte (threads and workers), resized crops by
resampling only, PNG and EXIF-turned files left to outcore's decoder, refusals; nvJPEG where a CUDA GPU is."""

from __future__ import annotations

import numpy as np
import pytest
from support.optional import need
from support.pictures import write_mixed_pictures

import outcore
from outcore.errors import OptionError, OutcoreWarning, SampleDecodeError
from outcore.format import ImageDecode
from outcore.imaging import decode_image
from outcore.testing import write_image_folder
from outcore.transforms import (
    CenterCrop,
    Compose,
    Normalize,
    RandomCrop,
    RandomFlip,
    RandomResizedCrop,
    Targets,
)

torch = need("torch")

WINDOWS = Compose([RandomCrop(48, padding=8), RandomFlip(horizontal=True, vertical=True)])  # copied: exact
RESIZED = Compose([RandomResizedCrop(40), RandomFlip()])  # resampled: close


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> outcore.Dataset:
    root = tmp_path_factory.mktemp("decode")
    write_image_folder(root / "photos", 24, classes=("a", "b"), size=(64, 64), kind="photos", seed=0)
    return outcore.ingest_images(root / "photos", root / "photos.zarr", shape=(64, 64, 3), images="encoded",
                                 chunk_size=16, progress=False)


@pytest.fixture(scope="module")
def own_sizes(tmp_path_factory) -> outcore.Dataset:
    """Pictures at their own sizes: a PNG, a greyscale JPEG and an EXIF-turned JPEG among plain ones."""
    root = tmp_path_factory.mktemp("own")
    write_mixed_pictures(root / "src")
    return outcore.ingest_images(root / "src", root / "own.zarr", shape=None, images="encoded", chunk_size=4,
                                 progress=False)


def _pairs(ds: outcore.Dataset, transform, **options) -> list[tuple[dict, dict]]:
    """(decoded on the "device", decoded here) batch pairs of one seed."""
    here = list(ds.torch(8, shuffle=True, seed=5, transform=transform, **options))
    there = list(ds.torch(8, shuffle=True, seed=5, transform=transform, decode="cpu", **options))
    assert len(here) == len(there) > 1
    return list(zip(there, here, strict=True))


@pytest.mark.parametrize(("workers", "start"), [(0, None), (2, "fork"), (2, "spawn")])
def test_windows_decoded_on_the_device_are_the_batches_decoded_here(photos, workers, start):
    """RandomCrop's padded windows, mirrored both ways, copy pixels: the same batches to the byte, made by threads
    or by DataLoader workers making parts of each batch (started by fork or spawn: what they are sent pickles)."""
    options = {"num_workers": workers, "multiprocessing_context": start} if workers else {}
    for there, here in _pairs(photos, WINDOWS, **options):
        assert there["images"].shape == here["images"].shape == (8, 48, 48, 3)
        assert torch.equal(there["images"], here["images"])
        assert torch.equal(there["labels"], here["labels"])
        assert sorted(there) == sorted(here)  # the files and their boxes are gone: the batch a user expects


def test_resized_crops_decoded_on_the_device_are_the_cpu_path_s(photos):
    """RandomResizedCrop's boxes are the same draws, resized by the same filter (as matrix products there): the
    same batches, where the decoders give the same pixels (pictures the CPU path decodes whole)."""
    for there, here in _pairs(photos, RESIZED):
        assert torch.equal(there["images"], here["images"])
        assert torch.equal(there["labels"], here["labels"])


def test_a_batch_cut_in_groups_of_a_few_pictures_is_the_batch_cut_at_once(photos, monkeypatch):
    """A batch's pictures are cut in groups of about `TOGETHER_BYTES` of float64 pixels (one array and two matrix
    products a group): groups of one to three pictures give the pixels of one group for all, windows past the
    pictures' edges and mirrored ones alike."""
    from outcore.adapters import torch_decode

    for transform in (RESIZED, WINDOWS):
        at_once = [batch["images"] for batch in photos.torch(8, shuffle=True, seed=5, transform=transform, decode="cpu")]
        monkeypatch.setattr(torch_decode, "TOGETHER_BYTES", 3 * 3 * 64 * 64 * 8)  # three 64x64 pictures at most
        grouped = [batch["images"] for batch in photos.torch(8, shuffle=True, seed=5, transform=transform, decode="cpu")]
        monkeypatch.undo()
        assert len(at_once) == len(grouped) > 1
        assert all(torch.equal(one, other) for one, other in zip(at_once, grouped, strict=True))


@pytest.mark.parametrize("resize", ["crop", "fit", "pad"])
def test_files_fitted_to_the_field_s_shape_are_cut_as_the_cpu_path_cuts_them(tmp_path, resize):
    """Files of another size than the field's: a plain JPEG's box is cut from the file's own pixels (``crop``,
    ``fit``), other policies cut it from the fitted picture, as the CPU path does; padded windows past the
    picture's edges are zeros. The output is large enough that the CPU path never decodes at a reduced scale."""
    write_image_folder(tmp_path / "photos", 8, classes=("a", "b"), size=(40, 60), kind="photos", seed=3)
    ds = outcore.ingest_images(tmp_path / "photos", tmp_path / "fitted.zarr", shape=(32, 32, 3), images="encoded",
                               resize=resize, chunk_size=8, progress=False)
    for transform in (Compose([RandomCrop(24, padding=6), RandomFlip()]),
                      Compose([RandomResizedCrop(32), RandomFlip(vertical=True)])):
        for there, here in _pairs(ds, transform):
            assert torch.equal(there["images"], here["images"])


def test_files_the_gpu_would_not_decode_alike_are_decoded_by_outcore(own_sizes):
    """The device's decoder is given the plain JPEGs only; the PNG, the EXIF-turned JPEG (nvJPEG ignores EXIF) go
    to outcore's decoder, upright: windows of every picture are the CPU path's, byte for byte."""
    given = []

    def decoder(files, channels):
        given.extend(bytes(data.numpy()) for data in files)
        return outcore.adapters.torch_decode.host_decoder(files, channels)

    window = Compose([RandomCrop(36, padding=4), RandomFlip()])
    here = list(own_sizes.torch(4, shuffle=True, seed=1, transform=window))
    loader = own_sizes.torch(4, shuffle=True, seed=1, transform=window, decode="cpu")
    loader._decoder.decoder = decoder
    for there, expected in zip(loader, here, strict=True):
        assert torch.equal(there["images"], expected["images"])
    assert len(given) == len(own_sizes) - 2  # all but the PNG and the EXIF-turned JPEG
    assert all(data[:2] == b"\xff\xd8" for data in given)


def test_own_sizes_resized_on_the_device_are_the_cpu_path_s_but_for_its_reduced_decodes(own_sizes):
    """CenterCrop's sub-pixel boxes: the same pixels. RandomResizedCrop's small boxes of large pictures: the CPU
    path decodes those at a reduced DCT scale (1/2, 1/4), the device in full: close, not equal."""
    for there, here in _pairs(own_sizes, CenterCrop(40, resize=48)):
        assert torch.equal(there["images"], here["images"])
    for there, here in _pairs(own_sizes, RESIZED):
        assert (there["images"].int() - here["images"].int()).abs().float().mean() < 2.0


def test_later_batches_hold_each_file_with_the_box_its_crop_drew(photos):
    """``decode="later"``: each sample's file as stored, its box and mirrors those the CPU path cuts (a window
    cut from the file decoded by hand is that path's sample)."""
    later = next(iter(photos.batches(8, shuffle=True, seed=2, transform=WINDOWS, decode="later")))
    here = next(iter(photos.batches(8, shuffle=True, seed=2, transform=WINDOWS)))
    offsets, boxes, flips = later["images_offsets"], later["images_boxes"], later["images_flips"]
    assert later["images"].dtype == np.uint8 and offsets.shape == (9,) and boxes.shape == (8, 4)
    np.testing.assert_array_equal(later["images_sizes"], np.tile([64, 64], (8, 1)))
    for k in range(8):
        data = later["images"][offsets[k] : offsets[k + 1]].tobytes()
        picture = np.pad(decode_image(data, (64, 64, 3), "crop", np.dtype(np.uint8)), ((8, 8), (8, 8), (0, 0)))
        top, left, height, width = (int(value) for value in boxes[k] + [8, 8, 0, 0])
        steps = 1 - 2 * flips[k].astype(int)  # -1: mirrored
        window = picture[top : top + height, left : left + width][:: steps[1], :: steps[0]]
        np.testing.assert_array_equal(window, here["images"][k])
    without = next(iter(photos.batches(8, decode="later")))  # no crop: the whole picture, unmirrored
    np.testing.assert_array_equal(without["images_boxes"], np.tile([0, 0, 64, 64], (8, 1)))
    assert not without["images_flips"].any()


def test_collate_fn_gets_the_decoded_batch(photos):
    seen = []
    loader = photos.torch(8, transform=WINDOWS, decode="cpu", collate_fn=lambda batch: seen.append(batch) or 1)
    assert list(loader) == [1] * 6  # 48 samples
    assert seen[0]["images"].shape == (8, 48, 48, 3) and "images_offsets" not in seen[0]


def test_channels_first_gives_the_device_batches_as_the_cpu_path_does(photos):
    there = next(iter(photos.torch(8, transform=WINDOWS, decode="cpu", channels_first=True)))
    here = next(iter(photos.torch(8, transform=WINDOWS, channels_first=True)))
    assert there["images"].shape == here["images"].shape == (8, 3, 48, 48)
    assert torch.equal(there["images"], here["images"])


def test_a_picture_kept_at_its_size_decoded_to_another_is_named(own_sizes):
    loader = own_sizes.torch(8, transform=WINDOWS, decode="cpu")
    loader._decoder.decoder = lambda files, channels: [torch.zeros((3, 30, 64), dtype=torch.uint8) for _ in files]
    with pytest.raises(SampleDecodeError, match=r"field 'images', sample \d+: decoded on cpu to \(30, 64\) with 3 "
                                                r"channels, but the store gives it \(\d+, \d+\)"):
        next(iter(loader))


def test_what_decode_cannot_take_is_refused_by_name(photos, ids_store):
    with pytest.raises(OptionError, match="decode='gpu': say 'here'"):
        photos.torch(8, decode="gpu")
    with pytest.raises(OptionError, match="hold none"):
        ids_store.torch(8, decode="cpu")
    with pytest.raises(OptionError, match=r"Normalize.*would run on the batch before its pictures \['images'\]"):
        photos.batches(8, transform=Compose([RandomResizedCrop(32), Normalize()]), decode="later")
    with pytest.raises(OptionError, match="targets move with the pictures"):
        photos.batches(8, transform=RandomResizedCrop(32, targets=Targets(label_maps=("labels",))), decode="later")
    with pytest.raises(OptionError, match="ds.keras and ds.tf hand the model pictures"):
        photos.keras(8, x="images", y="labels", decode="later")
    with pytest.raises(OptionError, match="decode='elsewhere': say 'here'"):
        photos.batches(8, decode="elsewhere")
    if not torch.cuda.is_available():
        with pytest.raises(OptionError, match="no CUDA device here"):
            photos.torch(8, decode="cuda")


def test_a_decoder_of_a_field_leaves_the_others_as_they_are():
    decoder = outcore.adapters.torch_decode.DeviceDecoder(
        {"x": outcore.adapters.torch_decode.Undecoded((2, 2), ImageDecode((4, 4, 3)))}, "cpu",
        decoder=lambda files, channels: [torch.arange(48, dtype=torch.uint8).reshape(3, 4, 4) for _ in files])
    files = b"\xff\xd8\xff\xdb\x00\x02\xff\xda" + b"\0" * 8 + b"\xff\xd9"  # segments that walk to the image data
    batch = {"x": torch.frombuffer(bytearray(files), dtype=torch.uint8), "x_offsets": torch.tensor([0, len(files)]),
             "x_boxes": torch.tensor([[1.0, 2.0, 2.0, 2.0]], dtype=torch.float64),
             "x_flips": torch.tensor([[1, 0]], dtype=torch.uint8), "x_sizes": torch.tensor([[4, 4]]),
             "y": torch.tensor([7])}
    out = decoder(batch)
    assert sorted(out) == ["x", "y"] and out["y"].tolist() == [7]
    channel_0 = out["x"][0, :, :, 0].tolist()  # rows 1-2, columns 2-3 of 0..15, mirrored left-right
    assert channel_0 == [[7, 6], [11, 10]]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (and torchvision)")
def test_nvjpeg_decodes_the_batches_of_the_cpu_path(photos):
    """nvJPEG's IDCT and chroma upsampling are not libjpeg-turbo's, so its pixels differ from the CPU path's by a few
    levels (on an H200 with torchvision 0.26 one batch of 8 windows differed by 2.22 on average): the same boxes
    differ by no more than the whole pictures do, where a box cut a pixel off would differ by far more."""
    need("torchvision")

    def difference(transform) -> float:
        """The mean absolute difference of an epoch's pixels, decoded by nvJPEG and here."""
        here = list(photos.torch(8, shuffle=True, seed=5, transform=transform))
        there = list(photos.torch(8, shuffle=True, seed=5, transform=transform, decode="cuda"))
        assert all(batch["images"].device.type == "cuda" for batch in there)
        pairs = zip(there, here, strict=True)
        return float(torch.cat([(got["images"].cpu().int() - expected["images"].int()).abs().flatten()
                                for got, expected in pairs]).float().mean())

    decoders = difference(CenterCrop(64))  # the whole pictures
    assert 0 < decoders < 8
    for transform in (WINDOWS, RESIZED):
        assert difference(transform) <= 1.25 * decoders + 0.25


def _cuts_of_many_sizes():
    """40 pictures of many sizes and their cuts to 48x48: sub-pixel boxes shrunk and enlarged, windows past the
    pictures' edges, mirrors both ways."""
    from outcore.adapters.torch_decode import Cut
    from outcore.imaging import box_part

    rng = np.random.default_rng(3)
    pictures, cuts = [], []
    for k in range(40):
        height, width = (int(side) for side in rng.integers(24, 300, size=2))
        pictures.append(torch.from_numpy(rng.integers(0, 256, (3, height, width), dtype=np.uint8)))
        top, left = rng.uniform(-8, height / 2), rng.uniform(-8, width / 2)
        box = (top, left, rng.uniform(8, height - max(top, 0)), rng.uniform(8, width - max(left, 0)))
        if k % 4 == 0:  # a window of whole pixels at the output's size, past the edges
            box = (float(int(top)), float(int(left)), 48.0, 48.0)
        flip = (bool(k % 2), bool(k % 3 == 0))
        part = box_part(box, (height, width), (48, 48), flip)
        cuts.append(None if part is None else Cut(part[0], part[1], part[2], flip))
    return pictures, cuts


def test_boxes_of_pictures_of_many_sizes_cut_together_are_each_cut_alone():
    """A batch's boxes are gathered from all its pictures' pixels at once, each padded to the group's largest with
    its last row and column: the pixels of outcore's threads (`resize_box`), and of each picture cut alone (no
    padding), to the byte."""
    from outcore.adapters.torch_decode import cut_together
    from outcore.imaging.resize import resize_box

    pictures, cuts = _cuts_of_many_sizes()
    together = cut_together(pictures, cuts, torch.zeros((40, 3, 48, 48), dtype=torch.uint8))
    expected = np.zeros((40, 48, 48, 3), np.uint8)
    for k, (picture, cut) in enumerate(zip(pictures, cuts, strict=True)):
        if cut is not None:
            expected[k][cut.where] = resize_box(picture.permute(1, 2, 0).numpy(), cut.box, cut.size, flip=cut.flip)
    np.testing.assert_array_equal(together.permute(0, 2, 3, 1).numpy(), expected)
    for k, (picture, cut) in enumerate(zip(pictures, cuts, strict=True)):
        alone = cut_together([picture], [cut], torch.zeros((1, 3, 48, 48), dtype=torch.uint8))
        assert torch.equal(together[k], alone[0]), k
    assert sum(cut is None for cut in cuts) < 5 < int(together.flatten(1).any(1).sum())
    # a decoder's (H, W, C) memory seen as (C, H, W): read where it lies, not copied
    views = [picture.permute(1, 2, 0).contiguous().permute(2, 0, 1) if k % 3 else picture for k, picture in
             enumerate(pictures)]
    framed = torch.zeros((3, pictures[1].shape[1] + 2, pictures[1].shape[2] + 2), dtype=torch.uint8)
    framed[:, 1:-1, 1:-1] = pictures[1]
    views[1] = framed[:, 1:-1, 1:-1]  # a window of other memory: no order of its axes is contiguous (copied)
    assert not views[2].is_contiguous()
    assert torch.equal(cut_together(views, cuts, torch.zeros((40, 3, 48, 48), dtype=torch.uint8)), together)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_boxes_cut_on_a_gpu_are_those_cut_on_the_cpu_to_the_byte():
    """`cut_together`'s float64 sums are exact: summed by a GPU's BLAS in its own order, in groups of any size, they
    give the CPU's pixels to the byte (`_cuts_of_many_sizes`)."""
    from outcore.adapters.torch_decode import cut_together

    pictures, cuts = _cuts_of_many_sizes()
    on_cpu = cut_together(pictures, cuts, torch.zeros((40, 3, 48, 48), dtype=torch.uint8))
    on_gpu = cut_together([picture.cuda() for picture in pictures], cuts,
                          torch.zeros((40, 3, 48, 48), dtype=torch.uint8, device="cuda"))
    assert on_gpu.device.type == "cuda" and torch.equal(on_gpu.cpu(), on_cpu)


def test_a_damaged_file_is_named_whichever_decoder_refuses_it(photos):
    """The device's decoder refuses the batch (nvJPEG raises for the whole list): each file is then decoded by
    outcore, which names the damaged one; the others' pixels are right."""
    loader = photos.torch(8, transform=WINDOWS, decode="cpu")
    decoder = loader._decoder
    batch = next(iter(photos.batches(8, transform=WINDOWS, decode="later")))
    files = {name: torch.from_numpy(values) for name, values in batch.items() if name.startswith("images")}
    second = int(files["images_offsets"][1])
    files["images"][second + 200 : second + 400] = 7  # the second file's entropy-coded data overwritten

    def refuses(files, channels):
        raise RuntimeError("nvjpeg: decode failed")

    decoder.decoder = refuses
    with pytest.warns(OutcoreWarning, match=r"field 'images': the decoder on cpu refused this batch's JPEGs "
                                            r"\(RuntimeError: nvjpeg: decode failed\); outcore decodes them"), \
            pytest.raises(outcore.errors.ImageError, match=r"photos.zarr: field 'images', sample 9: cannot decode"):
        decoder(type("Batch", (dict,), {"samples": np.arange(8, 16)})(files))


def test_a_file_kept_at_its_size_is_never_fitted_to_another_on_the_way(own_sizes):
    """A file outcore decodes for the device (here a PNG) whose size is not the one the batch gives it is its
    error, not a picture fitted to that size."""
    batch = next(iter(own_sizes.batches(len(own_sizes), decode="later", transform=RandomCrop(36, padding=4))))
    offsets = batch["images_offsets"]
    png = next(k for k in range(len(offsets) - 1) if batch["images"][offsets[k] : offsets[k] + 4].tobytes() == b"\x89PNG")
    batch["images_sizes"][png] += 2
    tensors = {name: torch.from_numpy(values) for name, values in batch.items() if name.startswith("images")}
    decoder = own_sizes.torch(8, transform=RandomCrop(36, padding=4), decode="cpu")._decoder
    with pytest.raises(outcore.errors.ImageError, match=r"own.zarr: field 'images', row \d+ of the batch: .*expected"):
        decoder(tensors)
