"""Pictures: decoding (libjpeg-turbo, Pillow) with DCT scaling, resizing by policy, encoded chunks, and
generated pictures for demos, tests and benchmarks. Used by ingest and by the read path."""

from ..storage.blocks import LEAD
from .crops import Box, box_part, center_crop_box, inside, random_resized_crop_box, within
from .decode import (
    IMAGE_DTYPES,
    IMAGE_EXTENSIONS,
    MAX_PIXELS,
    cut_from_file,
    decode_image,
    decoded_size,
    load_image,
    parse_image_dtype,
    parse_image_shape,
    plain_jpeg,
    read_image_file,
    stored_frame,
    upright_size,
)
from .drawings import Drawing
from .encoded import DecodedChunks, EncodedChunk, cut_rows, decode_rows
from .label_maps import (
    LABEL_MAP_DTYPES,
    Paired,
    Renumbered,
    check_placement,
    decode_label_map,
    fit_label_map,
    label_map_dtype,
    policy_crop,
)
from .resize import (
    RESIZE_POLICIES,
    ResizePolicy,
    fit,
    parse_resize,
    resize_box,
    resize_boxes,
    resize_taps,
)
from .shrink import DEFAULT_QUALITY, check_max_side, encode_image, shrink_image
from .targets import BoxPolicy, cut_label_maps, cut_maps, move_boxes, move_keypoints, move_points, owners
from .windows import copy_samples

__all__ = [
    "DEFAULT_QUALITY",
    "IMAGE_DTYPES",
    "IMAGE_EXTENSIONS",
    "LABEL_MAP_DTYPES",
    "LEAD",
    "MAX_PIXELS",
    "RESIZE_POLICIES",
    "Box",
    "BoxPolicy",
    "DecodedChunks",
    "Drawing",
    "EncodedChunk",
    "Paired",
    "Renumbered",
    "ResizePolicy",
    "box_part",
    "center_crop_box",
    "check_max_side",
    "check_placement",
    "copy_samples",
    "cut_from_file",
    "cut_label_maps",
    "cut_maps",
    "cut_rows",
    "decode_image",
    "decode_label_map",
    "decode_rows",
    "decoded_size",
    "encode_image",
    "fit",
    "fit_label_map",
    "inside",
    "label_map_dtype",
    "load_image",
    "move_boxes",
    "move_keypoints",
    "move_points",
    "owners",
    "parse_image_dtype",
    "parse_image_shape",
    "parse_resize",
    "plain_jpeg",
    "policy_crop",
    "random_resized_crop_box",
    "read_image_file",
    "resize_box",
    "resize_boxes",
    "resize_taps",
    "shrink_image",
    "stored_frame",
    "upright_size",
    "within",
]
