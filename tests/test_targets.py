"""Dense targets move with their pictures: label maps, boxes and keypoints, under every crop, flip and resize.

The proofs rasterise each box (and keypoint) into a label map before the transform and check after it that the
moved box covers exactly the map's pixels of that instance, draw by draw, on odd sizes, boxes on the borders and
pictures without boxes; ids are never made or changed; the crop done while a batch is made (from a pixel or an
encoded store) moves the targets as the transform on the decoded batch does, on every rank and after a resume.
"""

from __future__ import annotations

import numpy as np
import pytest
from support.calls import python_calls

import outcore
from outcore.errors import OptionError
from outcore.imaging import cut_label_maps
from outcore.iterate.batch import Recipe, make_batch
from outcore.iterate.readers import chunk_readers
from outcore.storage import RaggedChunk
from outcore.testing import write_image_folder
from outcore.transforms import (
    BoxPolicy,
    CenterCrop,
    Compose,
    Normalize,
    RandomCrop,
    RandomFlip,
    RandomResizedCrop,
    ScaleJitter,
    Targets,
)

EDGE = 1e-6  # output pixels: a pixel centre this near a moved box's edge may fall either side of it


def _boxes(rng: np.random.Generator, count: int, height: int, width: int) -> np.ndarray:
    """``count`` boxes of whole pixels in a picture of ``height`` x ``width``, some on its borders."""
    x0 = rng.integers(0, width - 1, count)
    y0 = rng.integers(0, height - 1, count)
    x1 = np.minimum(width, x0 + rng.integers(1, width, count))
    y1 = np.minimum(height, y0 + rng.integers(1, height, count))
    border = rng.random(count) < 0.3
    x0[border], y1[border] = 0, height
    return np.stack([x0, y0, x1, y1], axis=1).astype(np.float64)


def _instances(rng: np.random.Generator, pictures: int, height: int, width: int, most: int = 4) -> dict:
    """A batch of pictures with boxes (some with none), each box rasterised into its own channel of ``maps``
    (channel ``j`` of picture ``i`` is its ``j``-th box), and a keypoint at the centre of one pixel of each box."""
    counts = rng.integers(0, most + 1, pictures)
    counts[0] = 0
    offsets = np.concatenate([[0], np.cumsum(counts)])
    boxes = _boxes(rng, int(offsets[-1]), height, width)
    maps = np.zeros((pictures, height, width, most), np.uint8)
    points = np.zeros((len(boxes), 1, 3), np.float64)
    for row, (x0, y0, x1, y1) in enumerate(boxes.astype(int).tolist()):
        picture = int(np.searchsorted(offsets, row, side="right") - 1)
        maps[picture, y0:y1, x0:x1, row - offsets[picture]] = 1
        px, py = int(rng.integers(x0, x1)), int(rng.integers(y0, y1))
        points[row, 0] = px + 0.5, py + 0.5, 2
    return {"images": rng.integers(0, 256, (pictures, height, width, 3), dtype=np.uint8), "maps": maps,
            "boxes": boxes, "boxes_offsets": offsets, "box_labels": rng.integers(0, 80, len(boxes)),
            "points": points}


TARGETS = Targets(label_maps=("maps",), boxes="boxes", keypoints="points", instances=("box_labels",),
                  policy=BoxPolicy(min_size=0.0))

GEOMETRY = {
    "crop": lambda t: RandomCrop(23, targets=t),
    "padded crop + flips": lambda t: Compose([RandomCrop((19, 41), padding=9, targets=t),
                                              RandomFlip(vertical=True, targets=t)]),
    "resized crop": lambda t: RandomResizedCrop((33, 27), scale=(0.05, 1.0), targets=t),
    "resized crop + flip": lambda t: Compose([RandomResizedCrop(61, targets=t), RandomFlip(p=0.7, targets=t)]),
    "centre": lambda t: CenterCrop((29, 35), targets=t),
    "centre of resized": lambda t: CenterCrop(24, resize=30, targets=t),
    "flips": lambda t: RandomFlip(vertical=True, targets=t),
    "scale jitter + flip": lambda t: Compose([ScaleJitter((40, 36), scale=(0.3, 2.0), targets=t),
                                              RandomFlip(targets=t)]),
}
FUSED = [name for name in GEOMETRY if name != "flips"]  # the crops done as batches are made


def _raster(box: np.ndarray, size: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """The output pixels whose centres lie in ``box`` (x0, y0, x1, y1), and those too near its edges to say."""
    ys, xs = np.mgrid[0 : size[0], 0 : size[1]] + 0.5
    x0, y0, x1, y1 = box
    inside = (xs >= x0) & (xs < x1) & (ys >= y0) & (ys < y1)
    near = (np.minimum(np.abs(xs - x0), np.abs(xs - x1)) < EDGE) | (np.minimum(np.abs(ys - y0), np.abs(ys - y1)) < EDGE)
    return inside, near


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("geometry", GEOMETRY)
def test_a_moved_box_covers_exactly_the_pixels_of_its_moved_mask(geometry, seed):
    rng = np.random.default_rng(seed)
    batch = _instances(rng, 12, 31 + 2 * seed, 47 - seed)
    moved = GEOMETRY[geometry](TARGETS)(batch, np.random.default_rng(seed))
    size = moved["images"].shape[1:3]
    assert moved["maps"].shape == (12, *size, 4)
    offsets, kept = moved["boxes_offsets"], moved["boxes_kept"]
    assert offsets[0] == 0 and offsets[-1] == len(moved["boxes"]) == len(moved["box_labels"]) == len(kept)
    for picture in range(12):
        rows = range(offsets[picture], offsets[picture + 1])
        for row in rows:
            inside, near = _raster(moved["boxes"][row], size)
            mask = moved["maps"][picture, ..., kept[row]].astype(bool)
            assert ((mask == inside) | near).all(), (picture, row)
            assert moved["box_labels"][row] == batch["box_labels"][batch["boxes_offsets"][picture] + kept[row]]
        had = range(batch["boxes_offsets"][picture + 1] - batch["boxes_offsets"][picture])
        for gone in set(had) - {int(kept[row]) for row in rows}:
            assert not moved["maps"][picture, ..., gone].any(), "a dropped box still has pixels in the crop"
    assert np.isin(np.unique(moved["maps"]), [0, 1]).all()


@pytest.mark.parametrize("geometry", ["crop", "padded crop + flips", "resized crop + flip", "flips"])
def test_a_visible_keypoint_lands_on_its_pixel_of_the_moved_mask(geometry):
    """Checked where the output has as many pixels as the picture or more (a downscale may skip a point's pixel)."""
    for seed in range(8):
        rng = np.random.default_rng(seed)
        batch = _instances(rng, 10, 25, 29)
        for row, (x, y, _) in enumerate(batch["points"][:, 0].tolist()):  # the keypoint's pixel as its own id, 2
            picture = int(np.searchsorted(batch["boxes_offsets"], row, side="right") - 1)
            batch["maps"][picture, int(y), int(x), row - batch["boxes_offsets"][picture]] = 2
        moved = GEOMETRY[geometry](Targets(label_maps=("maps",), keypoints="points", boxes="boxes",
                                           policy=BoxPolicy(min_size=0)))(batch, np.random.default_rng(seed))
        height, width = moved["images"].shape[1:3]
        for picture in range(10):
            for row in range(moved["boxes_offsets"][picture], moved["boxes_offsets"][picture + 1]):
                x, y, visible = moved["points"][row, 0]
                channel = moved["maps"][picture, ..., moved["boxes_kept"][row]]
                if visible:
                    assert channel[int(y), int(x)] == 2, (seed, picture, row)
                else:
                    assert not (0 <= x < width and 0 <= y < height)


def test_ids_are_never_made_or_changed_and_the_padding_is_the_fill():
    rng = np.random.default_rng(3)
    ids = rng.choice(np.array([0, 7, 255, 1000, 65535], np.uint16), size=(16, 41, 37))
    batch = {"images": np.zeros((16, 41, 37, 3), np.uint8), "masks": ids}
    for geometry in GEOMETRY.values():
        moved = geometry(Targets(label_maps=("masks",), fill=9))(batch, np.random.default_rng(0))
        assert moved["masks"].dtype == np.uint16
        assert set(np.unique(moved["masks"]).tolist()) <= {0, 7, 255, 1000, 65535, 9}
    padded = RandomCrop(60, padding=20, targets=Targets(label_maps=("masks",), fill=9))(batch, np.random.default_rng(0))
    assert (padded["masks"] == 9).any()


def test_label_maps_are_cut_nearest_neighbour_pixel_by_pixel():
    """Against the rule written out per pixel: output (i, j) takes the picture's pixel under its centre."""
    rng = np.random.default_rng(0)
    maps = rng.integers(0, 50, (5, 13, 17), dtype=np.uint8)
    crops = np.array([[1.5, 2.25, 7.5, 11.0], [0, 0, 13, 17], [-3, -2, 9, 9], [4, 5, 3, 3], [2.0, 0.5, 10.2, 16.1]])
    flips = np.array([[1, 0], [0, 1], [1, 1], [0, 0], [1, 0]], bool)
    out = cut_label_maps(maps, crops, (9, 12), flips, fill=99)
    for n, (top, left, height, width) in enumerate(crops.tolist()):
        for i in range(9):
            for j in range(12):
                row = int(np.floor(top + (i + 0.5) * height / 9))
                column = int(np.floor(left + (j + 0.5) * width / 12))
                inside = 0 <= row < 13 and 0 <= column < 17
                at = (8 - i if flips[n, 1] else i, 11 - j if flips[n, 0] else j)
                assert out[n][at] == (maps[n, row, column] if inside else 99)


def test_a_mirror_image_swaps_left_and_right_keypoints_and_two_mirrors_do_not():
    points = np.array([[[2.5, 1.5, 2], [6.5, 1.5, 2], [4.5, 5.5, 1]]])  # left eye, right eye, nose
    batch = {"images": np.zeros((1, 8, 8, 3), np.uint8), "points": points, "points_offsets": np.array([0, 1])}
    targets = Targets(keypoints="points", flip_pairs=((0, 1),))
    once = RandomFlip(p=1.0, targets=targets)(batch, np.random.default_rng(0))["points"][0]
    assert once.tolist() == [[1.5, 1.5, 2], [5.5, 1.5, 2], [3.5, 5.5, 1]]  # the left eye is still on the left
    both = RandomFlip(p=1.0, vertical=True, targets=targets)(batch, np.random.default_rng(0))["points"][0]
    assert both.tolist() == [[5.5, 6.5, 2], [1.5, 6.5, 2], [3.5, 2.5, 1]]  # turned half round: no swap


def test_the_box_policy_drops_by_size_share_of_area_and_centre():
    """A 100x100 picture's central 50x50 window (x and y in [25, 75))."""
    boxes = np.array([[0, 30, 40, 40], [40, 30, 100, 40], [48, 50, 50.5, 60], [10, 90, 30, 99.0]])
    batch = {"images": np.zeros((1, 100, 100, 3), np.uint8), "boxes": boxes, "boxes_offsets": np.array([0, 4])}

    def kept(policy: BoxPolicy) -> list[int]:
        return CenterCrop(50, targets=Targets(boxes="boxes", policy=policy))(batch, None)["boxes_kept"].tolist()

    assert kept(BoxPolicy(min_size=0)) == kept(BoxPolicy()) == [0, 1, 2]  # the last lies outside the window
    assert kept(BoxPolicy(min_size=3)) == [0, 1]  # the third is 2.5 pixels wide
    assert kept(BoxPolicy(min_visible=0.5)) == [1, 2]  # 15 of the first's 40 columns are in the window, 35 of 60
    assert kept(BoxPolicy(centroid=True)) == [1, 2]  # the first's centre is at x = 20
    moved = CenterCrop(50, targets=Targets(boxes="boxes"))(batch, None)["boxes"]
    assert moved.tolist() == [[0, 5, 15, 15], [15, 5, 50, 15], [23, 25, 25.5, 35]]


def test_pictures_without_boxes_and_batches_without_any_pass_through():
    batch = {"images": np.zeros((3, 9, 9, 3), np.uint8), "boxes": np.zeros((0, 4)), "boxes_offsets": np.zeros(4, int)}
    moved = RandomResizedCrop(5, targets=Targets(boxes="boxes"))(batch, np.random.default_rng(0))
    assert moved["boxes"].shape == (0, 4) and moved["boxes_offsets"].tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize("make, message", [
    (lambda: Compose([RandomCrop(4, targets=Targets(label_maps=("m",))), RandomFlip()]), "same targets="),
    (lambda: Targets(label_maps="masks"), "a tuple of names"),
    (lambda: Targets(instances=("labels",)), "go with boxes= or keypoints="),
    (lambda: BoxPolicy(min_visible=2), "share of the box's area"),
    (lambda: RandomFlip(p=1.0, targets=Targets(label_maps=("m",)))(
        {"images": np.zeros((2, 4, 4)), "m": np.zeros((2, 4, 5))}, np.random.default_rng(0)), "'m'.*picture's own size"),
    (lambda: RandomFlip(p=1.0, targets=Targets(boxes="b"))(
        {"images": np.zeros((2, 4, 4)), "b": np.zeros((3, 4)), "b_offsets": np.array([0, 2, 2])},
        np.random.default_rng(0)), "'b' has 3 rows"),
    (lambda: RandomFlip(p=1.0, targets=Targets(boxes="b"))(
        {"images": np.zeros((2, 4, 4)), "b": np.zeros((3, 4)), "b_offsets": np.array([0, 3])},
        np.random.default_rng(0)), "'b_offsets' is not the offsets of 2"),
])
def test_targets_that_cannot_move_with_their_pictures_are_refused_by_name(make, message):
    with pytest.raises(OptionError, match=message):
        make()


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """A pixel and an encoded store of 64 photographs of 37x53, and masks holding each pixel's own number
    (row * 53 + column): a moved mask says which of the picture's pixels each of its pixels came from."""
    root = tmp_path_factory.mktemp("targets")
    write_image_folder(root / "src", 64, classes=("a",), size=(37, 53), kind="photos", seed=0)
    stores = {kind: outcore.ingest_images(root / "src", root / f"{kind}.zarr", shape=(37, 53, 3), images=kind,
                                          chunk_size=64, shuffle_on_write=False, progress=False)
              for kind in ("pixels", "encoded")}
    return stores, np.ascontiguousarray(np.broadcast_to(np.arange(37 * 53, dtype=np.uint16).reshape(37, 53), (64, 37, 53)))


def _batch(ds, masks, transform, fuse):
    """The 64 samples of chunk 0 and their masks as one batch of one piece, made by `make_batch`."""
    data = {0: {"images": chunk_readers(ds, ["images"])["images"].read(0), "masks": masks}}
    recipe = Recipe.of(["images", "masks"], (), ["images"] if fuse else [], transform)
    return make_batch(recipe, np.arange(64), 64, np.zeros(64, np.int64), data, ((64, (5, 0, 1, 2)),))


@pytest.mark.parametrize("kind", ["pixels", "encoded"])
@pytest.mark.parametrize("geometry", FUSED)
def test_a_crop_done_while_the_batch_is_made_moves_the_masks_as_the_transform_of_the_decoded_batch(photos, kind,
                                                                                                   geometry):
    stores, masks = photos
    transform = Compose([GEOMETRY[geometry](Targets(label_maps=("masks",), fill=65535)), Normalize()])
    assert Recipe.of(["images", "masks"], (), ["images"], transform).crop is not None
    fused, after = (_batch(stores[kind], masks, transform, fuse) for fuse in (True, False))
    np.testing.assert_array_equal(fused["masks"], after["masks"])
    assert fused["images"].shape[:3] == fused["masks"].shape
    if kind == "pixels":  # the same resize of the same boxes, while copying or on the decoded batch
        np.testing.assert_array_equal(fused["images"], after["images"])
    if kind == "pixels" and geometry in ("crop", "padded crop + flips", "centre"):  # windows: each pixel is its mask's
        source = stores[kind]["images"][:64].compute().reshape(64, -1, 3)
        inside = fused["masks"] != 65535
        taken = np.take_along_axis(source, np.where(inside, fused["masks"], 0).reshape(64, -1, 1).astype(np.int64), 1)
        pixels = np.rint(fused["images"] * 255).astype(np.uint8)
        np.testing.assert_array_equal(pixels[inside], taken.reshape(pixels.shape)[inside])
        assert (pixels[~inside] == 0).all()


def test_every_rank_and_a_resume_move_each_samples_mask_alike(tmp_path):
    rng = np.random.default_rng(0)
    coordinates = np.arange(21 * 26, dtype=np.uint16).reshape(21, 26)
    ds = outcore.from_arrays({"images": rng.integers(0, 256, (150, 21, 26, 3), dtype=np.uint8),
                              "masks": np.ascontiguousarray(np.broadcast_to(coordinates, (150, 21, 26))),
                              "ids": np.arange(150)}, tmp_path / "s.zarr", chunk_size=16, progress=False)
    targets = Targets(label_maps=("masks",))
    transform = Compose([RandomResizedCrop((15, 17), targets=targets), RandomFlip(vertical=True, targets=targets)])

    def masks(batches) -> dict[int, bytes]:
        return {int(i): mask.tobytes() for batch in batches for i, mask in zip(batch["ids"], batch["masks"], strict=True)}

    one = masks(ds.batches(batch_size=16, seed=4, transform=transform))
    assert len(one) == 150 and len(set(one.values())) > 100
    two = {**masks(ds.batches(batch_size=8, seed=4, transform=transform, rank=0, world_size=2)),
           **masks(ds.batches(batch_size=8, seed=4, transform=transform, rank=1, world_size=2))}
    assert two == one
    first = ds.batches(batch_size=16, seed=4, transform=transform)
    seen = masks(batch for _, batch in zip(range(3), first))
    resumed = ds.batches(batch_size=16, seed=4, transform=transform)
    resumed.load_state_dict(first.state_dict())
    assert {**seen, **masks(resumed)} == one


def test_a_loader_whose_targets_name_a_field_it_leaves_out_is_refused_when_made(tmp_path):
    ds = outcore.from_arrays({"images": np.zeros((8, 4, 4, 3), np.uint8), "masks": np.zeros((8, 4, 4), np.uint8)},
                             tmp_path / "s.zarr", progress=False)
    with pytest.raises(OptionError, match="'masks', which the batches do not hold"):
        ds.batches(batch_size=4, fields=["images"], transform=RandomFlip(targets=Targets(label_maps=("masks",))))


@pytest.mark.parametrize("dtype, channels", [(np.uint8, ()), (np.uint16, ()), (np.int32, ()), (np.float64, ()),
                                             (np.uint8, (3,)), (np.uint16, (2,))])
def test_the_c_cut_gives_the_bytes_of_numpys(monkeypatch, dtype, channels):
    from outcore.imaging import native

    if native.windows is None:
        pytest.skip(f"outcore's C copies are not built here: {native.copies()}")
    rng = np.random.default_rng(1)
    drawn = np.concatenate([rng.uniform(-6, 16, (58, 2)), rng.uniform(0.01, 30, (58, 2))], axis=1)  # C finds the lines
    crops = np.array([[-3, -4, 20, 25], [0, 0, 11, 17], [2.5, 3.5, 4, 6], [5, 9, 30, 30], [0, 0, 1, 1], [10, 16, 1, 1],
                      *drawn, [1 / 3, 2 / 3, 9 * (1 + 2**-52), 13 * (1 - 2**-53)]])
    maps = rng.integers(0, 100, (len(crops), 11, 17, *channels)).astype(dtype)
    flips = rng.random((len(crops), 2)) < 0.5
    made = cut_label_maps(maps, crops, (9, 13), flips, fill=7)
    monkeypatch.setattr(native, "windows", None)
    np.testing.assert_array_equal(made, cut_label_maps(maps, crops, (9, 13), flips, fill=7))


@pytest.mark.parametrize("built", [True, False])
def test_a_cut_into_maps_of_another_size_than_asked_is_refused_with_either_backend(monkeypatch, built):
    from outcore.imaging import cut_maps, native

    if built and native.windows is None:
        pytest.skip(f"outcore's C copies are not built here: {native.copies()}")
    if not built:
        monkeypatch.setattr(native, "windows", None)
    out = np.full((1, 4, 5), 3, np.uint8)
    with pytest.raises(ValueError, match=r"out's maps are \(4, 5\), not the size \(5, 4\)"):
        cut_maps([np.zeros(16, np.uint8)], np.zeros(1), np.zeros(1), np.array([[4, 4]]), np.array([[0, 0, 4, 4]]),
                 (5, 4), np.zeros((1, 2)), 0, out, np.zeros(1))
    assert (out == 3).all()


def test_moving_a_batchs_targets_makes_no_python_call_per_sample(photos):
    """The crop done as the batch is made, with masks and boxes moved by it: a handful more calls for 8x the samples."""
    from outcore.imaging import native

    if native.windows is None:
        pytest.skip(f"outcore's C copies are not built here: {native.copies()}")
    stores, masks = photos
    targets = Targets(label_maps=("masks",), boxes="boxes", instances=("box_labels",))
    transform = Compose([RandomCrop(24, targets=targets), RandomFlip(vertical=True, targets=targets)])
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 5, 512)
    boxes = outcore.Ragged.of([np.sort(rng.uniform(0, 37, (c, 4)), axis=1) for c in counts], np.float32, (4,))
    chunk = {"images": chunk_readers(stores["pixels"], ["images"])["images"].read(0),
             "masks": np.concatenate([masks] * 8), "boxes": RaggedChunk(boxes.values, np.c_[boxes.offsets[:-1], boxes.offsets[1:]]),
             "box_labels": RaggedChunk(np.arange(len(boxes.values)), np.c_[boxes.offsets[:-1], boxes.offsets[1:]])}
    chunk["images"] = np.concatenate([chunk["images"]] * 8)
    recipe = Recipe.of(list(chunk), (), ["images"], transform, ["boxes", "box_labels"])

    def make(count: int) -> None:
        make_batch(recipe, np.arange(count), 512, np.zeros(count, np.int64), {0: chunk}, ((count, (1, 2, 3, 4)),))

    outcore.set_threads(1)  # every run on this thread, where the calls are counted
    try:
        few, many = python_calls(lambda: make(32)), python_calls(lambda: make(256))
    finally:
        outcore.set_threads(None)
    assert many <= few + 8, (few, many)


@pytest.mark.parametrize("seed", range(3))
def test_scale_jitter_keeps_each_pictures_pixels_over_their_ids_and_its_paired_pictures_with_it(seed):
    """Pictures whose colours are their pixels' rows and columns, maps holding each pixel's number: after the jitter,
    each picture pixel shows the row and column its map's id names (within a pixel and a half: bilinear)."""
    height, width = 50, 70
    rows, columns = np.mgrid[0:height, 0:width]
    pictures = np.zeros((6, height, width, 3), np.uint8)
    pictures[..., 0], pictures[..., 1] = rows * 5, columns * 3
    ids = np.broadcast_to((rows * width + columns).astype(np.uint16), (6, height, width)).copy()
    batch = {"images": pictures, "masks": ids, "second": pictures.copy()}
    targets = Targets(label_maps=("masks",), pictures=("second",), fill=65535)
    moved = Compose([ScaleJitter((48, 56), scale=(0.4, 2.0), targets=targets), RandomFlip(targets=targets)])(
        batch, np.random.default_rng(seed))
    np.testing.assert_array_equal(moved["second"], moved["images"])  # a paired picture moves as its picture
    inside = moved["masks"] != 65535
    assert inside.any()
    row, column = np.divmod(moved["masks"][inside].astype(np.int64), width)
    assert (np.abs(moved["images"][inside][:, 0].astype(int) - row * 5) <= 8).all()
    assert (np.abs(moved["images"][inside][:, 1].astype(int) - column * 3) <= 5).all()
    assert (moved["images"][~inside] == 0).all()
