"""Label maps and paired pictures ingested beside their pictures: Pascal VOC's palettes, Cityscapes' label PNGs.

Files are written by Pillow (palette, grey and 16-bit PNGs, and JPEG pictures), listed in a DataFrame's mask
columns. Each picture is painted in its map's regions with one colour per id, so a map that does not lie under its
picture (another sample's, or moved by another geometry) shows: the stored maps are the files' ids fitted as the
pictures are (nearest-neighbour), in the stored order, and stay under their pictures through a training transform.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from PIL import Image

import outcore
from outcore.errors import ImageError, OptionError, SourceError
from outcore.transforms import Compose, RandomCrop, RandomFlip, RandomResizedCrop, ScaleJitter, Targets

PALETTE = np.random.default_rng(7).integers(0, 256, (256, 3), dtype=np.uint8)
PALETTE[0] = 0


def _blocks(rng: np.random.Generator, height: int, width: int, ids: np.ndarray) -> np.ndarray:
    """A map of ``ids`` in blocks of 8x8 pixels (so that a picture resized bilinearly is flat inside them)."""
    coarse = rng.choice(ids, size=(-(-height // 8), -(-width // 8)))
    return np.kron(coarse, np.ones((8, 8), coarse.dtype))[:height, :width]


def _voc(root, count: int = 24) -> pd.DataFrame:
    """Pictures of varied sizes (PNG: exact colours) with palette PNG maps of ids 0-20 and 255 (void)."""
    rng = np.random.default_rng(0)
    rows = []
    (root / "JPEGImages").mkdir(parents=True)
    (root / "SegmentationClass").mkdir()
    for i in range(count):
        height, width = int(rng.integers(40, 72)), int(rng.integers(40, 72))
        ids = _blocks(rng, height, width, np.array([*range(21), 255], np.uint8))
        Image.fromarray(PALETTE[ids]).save(root / "JPEGImages" / f"{i:04}.png")
        mask = Image.fromarray(ids, mode="P")
        mask.putpalette(PALETTE.reshape(-1).tolist())
        mask.save(root / "SegmentationClass" / f"{i:04}.png")
        rows.append({"path": f"JPEGImages/{i:04}.png", "mask": f"SegmentationClass/{i:04}.png", "label": i % 3})
    return pd.DataFrame(rows)


def _ids_under(batch_images: np.ndarray, batch_maps: np.ndarray) -> float:
    """The share of pixels inside flat regions (all 3x3 neighbours of one id) whose colour is their id's."""
    maps = batch_maps.astype(np.int64)
    flat = np.ones(maps.shape, bool)
    for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
            flat &= np.roll(maps, (dy, dx), axis=(1, 2)) == maps
    flat[:, [0, -1]] = flat[:, :, [0, -1]] = False
    same = (np.abs(batch_images.astype(int) - PALETTE[maps].astype(int)) <= 2).all(axis=-1)
    return float(same[flat].mean())


@pytest.mark.parametrize("resize", ["crop", "fit", "pad"])
def test_palette_maps_are_stored_under_their_pictures_with_their_ids(tmp_path, resize):
    frame = _voc(tmp_path / "voc")
    ds = outcore.ingest_dataframe(frame, tmp_path / "s.zarr", root=tmp_path / "voc", label_columns=["label"],
                                  mask_columns=["mask"], shape=(48, 56, 3), resize=resize, images="pixels",
                                  progress=False)
    masks, images = ds["mask"].compute(), ds["images"].compute()
    assert masks.dtype == np.uint8 and masks.shape == (24, 48, 56)
    assert ds.info("mask").role == "target"
    assert set(np.unique(masks)) <= {*range(21), 255}
    assert _ids_under(images, masks) == 1.0  # each stored map lies under its own (shuffled) picture
    order = ds["source_index"].compute()
    for row, source in enumerate(order.tolist()):
        ids = np.asarray(Image.open(tmp_path / "voc" / frame["mask"][source]))
        expected = outcore.imaging.fit_label_map(ids, (48, 56), resize, "m")
        np.testing.assert_array_equal(masks[row], expected)


@pytest.mark.parametrize("shape", [(64, 96, 3), None], ids=["fitted", "own-size"])
def test_cityscapes_label_and_instance_maps_keep_16_bit_ids_and_move_with_a_training_transform(tmp_path, shape):
    rng = np.random.default_rng(1)
    rows = []
    for i in range(16):
        labels = _blocks(rng, 64, 96, np.array([0, 7, 8, 24, 26, 33], np.uint8))
        instances = np.where(labels >= 24, labels.astype(np.uint16) * 1000 + rng.integers(0, 5), labels)
        Image.fromarray(PALETTE[labels]).save(tmp_path / f"{i}_leftImg8bit.png")
        Image.fromarray(labels, mode="L").save(tmp_path / f"{i}_gtFine_labelIds.png")
        Image.fromarray(instances.astype(np.uint16)).save(tmp_path / f"{i}_gtFine_instanceIds.png")
        rows.append({"path": f"{i}_leftImg8bit.png", "labelIds": f"{i}_gtFine_labelIds.png",
                     "instanceIds": f"{i}_gtFine_instanceIds.png"})
    ds = outcore.ingest_dataframe(pd.DataFrame(rows), tmp_path / "s.zarr", root=tmp_path, shape=shape,
                                  mask_columns=["labelIds", "instanceIds"], images="encoded", chunk_size=8,
                                  progress=False)
    assert ds.info("labelIds").dtype == "uint8" and ds.info("instanceIds").dtype == "uint16"
    assert ds.info("instanceIds").is_raster == (shape is None)
    stored = [ds["instanceIds"][i].compute() for i in range(len(ds))]
    assert all(ids.shape == (64, 96) and ids.dtype == np.uint16 for ids in stored)
    assert max(int(ids.max()) for ids in stored) > 20000
    targets = Targets(label_maps=("labelIds", "instanceIds"))
    transform = Compose([RandomResizedCrop((40, 40), scale=(0.3, 1.0), targets=targets), RandomFlip(targets=targets)])
    seen = 0
    for batch in ds.batches(batch_size=8, seed=2, transform=transform):
        assert batch["labelIds"].shape == batch["instanceIds"].shape == (len(batch["images"]), 40, 40)
        things = batch["instanceIds"] >= 1000
        np.testing.assert_array_equal(batch["instanceIds"][things] // 1000, batch["labelIds"][things])
        np.testing.assert_array_equal(batch["instanceIds"][~things], batch["labelIds"][~things])
        assert _ids_under(batch["images"], batch["labelIds"]) > 0.98  # bilinear pictures, nearest maps
        seen += len(batch["images"])
    assert seen == 16


def test_maps_that_cannot_lie_under_their_pictures_are_refused_by_name(tmp_path):
    picture = np.zeros((20, 30, 3), np.uint8)
    Image.fromarray(picture).save(tmp_path / "a.png")
    Image.fromarray(np.zeros((20, 31), np.uint8), mode="L").save(tmp_path / "wide.png")
    Image.fromarray(picture).save(tmp_path / "colour.png")
    Image.fromarray(np.zeros((20, 30), np.uint8), mode="L").save(tmp_path / "lossy.jpg")
    exif = Image.Exif()
    exif[0x0112] = 6  # stored turned a quarter
    Image.fromarray(np.zeros((30, 30, 3), np.uint8)).save(tmp_path / "turned.jpg", exif=exif)
    Image.fromarray(np.zeros((30, 30), np.uint8), mode="L").save(tmp_path / "square.png")
    cases = [("a.png", "wide.png", "20x31, its picture .*a.png is 20x30"),
             ("a.png", "colour.png", "mode 'RGB' \\(colours\\)"),
             ("a.png", "lossy.jpg", "JPEG label map"),
             ("turned.jpg", "square.png", "EXIF orientation 6")]
    for (picture_file, map_file, message), (shape, images) in itertools.product(
            cases, [((20, 30, 3), "pixels"), (None, "encoded")]):  # fitted, or at the picture's own size
        frame = pd.DataFrame({"path": [picture_file], "mask": [map_file]})
        with pytest.raises(ImageError, match=message) as raised:
            outcore.ingest_dataframe(frame, tmp_path / "s.zarr", root=tmp_path, mask_columns=["mask"],
                                     shape=shape, images=images, overwrite=True, progress=False)
        assert map_file in str(raised.value)
    frame = pd.DataFrame({"path": ["a.png"], "mask": ["gone.png"]})
    with pytest.raises(SourceError, match="mask column 'mask': the files of rows 0 do not exist"):
        outcore.ingest_dataframe(frame, tmp_path / "t.zarr", root=tmp_path, mask_columns=["mask"], shape=(20, 30, 3))
    with pytest.raises(OptionError, match="max_side= shrinks pictures without what lies on them \\(\\['mask'\\]\\)"):
        outcore.ingest_dataframe(pd.DataFrame({"path": ["a.png"], "mask": ["wide.png"]}), tmp_path / "u.zarr",
                                 root=tmp_path, mask_columns=["mask"], shape=None, max_side=16, images="encoded")
    Image.fromarray(np.full((20, 30), 300, np.uint16)).save(tmp_path / "deep.png")
    frame = pd.DataFrame({"path": ["a.png"], "mask": ["deep.png"]})
    with pytest.raises(ImageError, match="ids up to 300, more than uint8 holds: pass mask_dtype='uint16'"):
        outcore.ingest_dataframe(frame, tmp_path / "v.zarr", root=tmp_path, mask_columns=["mask"], mask_dtype="uint8",
                                 shape=(20, 30, 3), images="pixels", progress=False)


def test_a_block_s_label_maps_are_decoded_in_one_call_as_one_by_one(tmp_path, monkeypatch):
    """Label maps at their picture's own size: a block's plain PNGs of ids (a 4-bit palette and a grey map among 8-bit
    palettes) read and decoded by one call of the C extension (`decode_png_files`): the stored ids are those decoded
    one by one without the extension, row for row."""
    from outcore.imaging import native

    frame = _voc(tmp_path / "voc", count=12)
    small = Image.fromarray((np.asarray(Image.open(tmp_path / "voc" / frame["mask"][3])) % 16).astype(np.uint8),
                            mode="P")
    small.putpalette(PALETTE[:16].reshape(-1).tolist())
    small.save(tmp_path / "voc" / "SegmentationClass" / "0003.png", bits=4)
    grey = np.asarray(Image.open(tmp_path / "voc" / frame["mask"][5]))
    Image.fromarray(grey, mode="L").save(tmp_path / "voc" / "SegmentationClass" / "0005.png")
    options = {"root": tmp_path / "voc", "mask_columns": ["mask"], "label_columns": ["label"], "shape": None, "images": "encoded",
               "shuffle_on_write": False, "chunk_size": 4, "progress": False}
    calls = []
    if getattr(native.extension, "decode_png_files", None) is not None:
        decode = native.extension.decode_png_files
        monkeypatch.setattr(native, "extension", _Spy(native.extension, calls, decode))
    ds = outcore.ingest_dataframe(frame, tmp_path / "c.zarr", **options)
    if getattr(native.extension, "ZLIB", ""):
        assert sum(len(paths) - len(left) for paths, left in calls) == 12
    monkeypatch.undo()
    monkeypatch.setattr(native, "extension", None)
    one_by_one = outcore.ingest_dataframe(frame, tmp_path / "p.zarr", **options)
    for row in range(12):
        np.testing.assert_array_equal(ds["mask"][row].compute(), one_by_one["mask"][row].compute())
        expected = np.asarray(Image.open(tmp_path / "voc" / frame["mask"][row]))
        np.testing.assert_array_equal(ds["mask"][row].compute(), expected)


def test_a_block_s_paired_pictures_are_decoded_in_one_call_as_one_by_one(tmp_path, monkeypatch):
    """Paired pictures at their picture's own size (16-bit depth maps): a block's plain PNGs of the column's kind read
    and decoded by one call of the C extension, the stored pixels those decoded one by one without it; a file of
    another kind is still refused by name."""
    from outcore.imaging import native

    rng = np.random.default_rng(8)
    rows = []
    for i in range(10):
        height, width = int(rng.integers(20, 40)), int(rng.integers(20, 40))
        Image.fromarray(rng.integers(0, 256, (height, width, 3)).astype(np.uint8)).save(tmp_path / f"{i}.png")
        Image.fromarray(rng.integers(0, 65536, (height, width)).astype(np.uint16)).save(tmp_path / f"{i}-depth.png")
        rows.append({"path": f"{i}.png", "depth": f"{i}-depth.png"})
    options = {"root": tmp_path, "pair_columns": ["depth"], "shape": None, "images": "encoded",
               "shuffle_on_write": False, "chunk_size": 4, "progress": False}
    calls = []
    if getattr(native.extension, "decode_png_files", None) is not None:
        monkeypatch.setattr(native, "extension", _Spy(native.extension, calls, native.extension.decode_png_files))
    ds = outcore.ingest_dataframe(pd.DataFrame(rows), tmp_path / "c.zarr", **options)
    if getattr(native.extension, "ZLIB", ""):
        assert sum(len(paths) - len(left) for paths, left in calls) == 10
    monkeypatch.undo()
    monkeypatch.setattr(native, "extension", None)
    one_by_one = outcore.ingest_dataframe(pd.DataFrame(rows), tmp_path / "p.zarr", **options)
    for row in range(10):
        np.testing.assert_array_equal(ds["depth"][row].compute(), one_by_one["depth"][row].compute())
        expected = np.asarray(Image.open(tmp_path / f"{row}-depth.png"))[..., None]
        np.testing.assert_array_equal(ds["depth"][row].compute(), expected)


class _Spy:
    """The C extension, its ``decode_png_files`` calls recorded: ``(paths, positions left)`` each."""

    def __init__(self, extension, calls, decode):
        self._extension, self._calls, self._decode = extension, calls, decode

    def __getattr__(self, name):
        return getattr(self._extension, name)

    def decode_png_files(self, paths, outs, ids=False, exact=False):
        left = self._decode(paths, outs, ids, exact)
        self._calls.append((list(paths), list(left)))
        return left


def test_a_bad_map_of_a_picture_kept_at_its_own_size_is_skipped_with_its_picture(tmp_path):
    rng = np.random.default_rng(3)
    rows = []
    for i, (height, width) in enumerate([(20, 30), (25, 17), (31, 22), (18, 18)]):
        Image.fromarray(np.full((height, width, 3), i, np.uint8)).save(tmp_path / f"{i}.png")
        ids = rng.integers(0, 400, (height, width)).astype(np.uint16)
        Image.fromarray(ids if i != 2 else np.zeros((height, width, 3), np.uint8)).save(tmp_path / f"{i}-ids.png")
        rows.append({"path": f"{i}.png", "mask": f"{i}-ids.png"})
    ds = outcore.ingest_dataframe(pd.DataFrame(rows), tmp_path / "s.zarr", root=tmp_path, mask_columns=["mask"],
                                  mask_dtype="uint16", shape=None, images="encoded", on_error="skip",
                                  shuffle_on_write=False, chunk_size=2, progress=False)
    assert len(ds) == 3 and ds.attrs.skipped["count"] == 1 and "2-ids.png" in ds.attrs.skipped["examples"][0]
    for stored, source in enumerate([0, 1, 3]):
        np.testing.assert_array_equal(ds["mask"][stored].compute(), np.asarray(Image.open(tmp_path / f"{source}-ids.png")))
        assert int(ds["images"][stored].compute()[0, 0, 0]) == source


@pytest.mark.parametrize("shape", [(45, 60, 3), None], ids=["fitted", "own-size"])
def test_paired_pictures_are_fitted_and_moved_with_their_pictures(tmp_path, shape):
    """Depth maps (16-bit PNGs) beside pictures whose colours say each pixel's row and column: stored fitted as the
    pictures are (or both at their own size), and cut, resized and mirrored with them by a training transform."""
    rows, columns = np.mgrid[0:60, 0:80]
    entries = []
    for i in range(6):
        picture = np.stack([rows * 4, columns * 3, np.full_like(rows, 40 * i)], axis=-1).astype(np.uint8)
        Image.fromarray(picture).save(tmp_path / f"{i}.png")
        Image.fromarray((rows * 1000 + columns * 10).astype(np.uint16)).save(tmp_path / f"{i}-depth.png")
        entries.append({"path": f"{i}.png", "depth": f"{i}-depth.png"})
    ds = outcore.ingest_dataframe(pd.DataFrame(entries), tmp_path / "s.zarr", root=tmp_path, pair_columns=["depth"],
                                  shape=shape, resize="crop", images="pixels" if shape else "encoded", progress=False)
    depth = ds["depth"][5].compute()
    assert depth.dtype == np.uint16 and depth.shape == (*(shape or (60, 80))[:2], 1) and ds.info("depth").role == "input"
    if shape is None:
        np.testing.assert_array_equal(depth[..., 0], rows * 1000 + columns * 10)
    targets = Targets(pictures=("depth",))
    transform = Compose([RandomResizedCrop((32, 32), scale=(0.2, 1.0), targets=targets), RandomFlip(targets=targets)])
    for batch in ds.batches(batch_size=3, seed=4, transform=transform):
        depth = batch["depth"][..., 0].astype(np.float64)
        picture = batch["images"].astype(np.float64)
        # both are linear in the source's row and column, and resampled by the same box: depth = 1000 row + 10 column
        expected = 1000 * picture[..., 0] / 4 + 10 * picture[..., 1] / 3
        assert np.abs(depth - expected).max() <= 300  # within 0.3 of a row (the picture's 8-bit rounding: 0.125)


@pytest.mark.parametrize("head", ["resized crop", "padded crop", "scale jitter"])
def test_paired_pictures_at_their_own_size_are_cut_exactly_as_paired_pictures_of_one_size(tmp_path, head):
    rng = np.random.default_rng(5)
    entries = []
    for i in range(10):
        Image.fromarray(rng.integers(0, 256, (30, 44, 3), dtype=np.uint8)).save(tmp_path / f"{i}.png")
        Image.fromarray(rng.integers(0, 65536, (30, 44), dtype=np.uint16)).save(tmp_path / f"{i}-depth.png")
        entries.append({"path": f"{i}.png", "depth": f"{i}-depth.png"})
    stores = [outcore.ingest_dataframe(pd.DataFrame(entries), tmp_path / f"{name}.zarr", root=tmp_path,
                                       pair_columns=["depth"], shape=shape, images="encoded", chunk_size=4,
                                       shuffle_on_write=False, progress=False)
              for name, shape in (("fitted", (30, 44, 3)), ("own", None))]
    assert [ds.info("depth").is_raster for ds in stores] == [False, True]
    targets = Targets(pictures=("depth",))
    crop = {"resized crop": RandomResizedCrop((17, 23), scale=(0.1, 1.0), targets=targets),
            "padded crop": RandomCrop((26, 40), padding=5, targets=targets),
            "scale jitter": ScaleJitter((36, 36), scale=(0.3, 1.5), targets=targets)}[head]
    transform = Compose([crop, RandomFlip(vertical=True, targets=targets)])
    fitted, own = ([batch for batch in ds.batches(4, seed=6, transform=transform)] for ds in stores)
    for a, b in zip(fitted, own, strict=True):
        for name in ("images", "depth"):
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    assert own[0]["depth"].dtype == np.uint16 and own[0]["depth"].shape == (4, *crop.output_size, 1)


def test_a_paired_picture_of_another_kind_than_its_columns_first_is_refused_by_name(tmp_path):
    for i in range(2):
        Image.fromarray(np.zeros((20, 30, 3), np.uint8)).save(tmp_path / f"{i}.png")
    Image.fromarray(np.zeros((20, 30), np.uint16)).save(tmp_path / "0-depth.png")
    Image.fromarray(np.zeros((20, 30), np.uint8), mode="L").save(tmp_path / "1-depth.png")  # 8-bit among 16-bit
    frame = pd.DataFrame({"path": ["0.png", "1.png"], "depth": ["0-depth.png", "1-depth.png"]})
    with pytest.raises(ImageError, match="1-depth.png: a paired picture of 1 channel.s. of uint8, where its column's "
                                         "first file has 1 of uint16"):
        outcore.ingest_dataframe(frame, tmp_path / "s.zarr", root=tmp_path, pair_columns=["depth"], shape=(20, 30, 3),
                                 images="pixels", progress=False)
