"""Vectorized, seeded batch augmentations: ``transform(batch, rng) -> batch`` (the public path of
`outcore.iterate.transforms`, where they are made)."""

from .imaging import BoxPolicy
from .iterate.targets import Targets, left_right_pairs
from .iterate.transforms import (
    BrightnessContrast,
    Cast,
    CenterCrop,
    Compose,
    Normalize,
    RandomCrop,
    RandomFlip,
    RandomResizedCrop,
    ScaleJitter,
)

__all__ = ["BoxPolicy", "BrightnessContrast", "Cast", "CenterCrop", "Compose", "Normalize", "RandomCrop", "RandomFlip",
           "RandomResizedCrop", "ScaleJitter", "Targets", "left_right_pairs"]
