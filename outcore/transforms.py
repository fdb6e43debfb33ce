"""Vectorized, seeded batch augmentations: ``transform(batch, rng) -> batch`` (the public path of
`outcore.iterate.transforms`, where they are made)."""

from .iterate.transforms import BrightnessContrast, Cast, Compose, Normalize, RandomCrop, RandomFlip

__all__ = ["BrightnessContrast", "Cast", "Compose", "Normalize", "RandomCrop", "RandomFlip"]
