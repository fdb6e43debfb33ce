"""Vectorized, seeded batch augmentations: ``transform(batch, rng) -> batch`` (the public path of
`outcore.iterate.transforms`, where they are made)."""

from .iterate.transforms import (
    BrightnessContrast,
    Cast,
    CenterCrop,
    Compose,
    Normalize,
    RandomCrop,
    RandomFlip,
    RandomResizedCrop,
)

__all__ = ["BrightnessContrast", "Cast", "CenterCrop", "Compose", "Normalize", "RandomCrop", "RandomFlip",
           "RandomResizedCrop"]
