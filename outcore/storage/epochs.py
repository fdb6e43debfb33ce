"""How fast an epoch of a store runs on this machine: the one model behind ``outcore bench``'s advice and
ingest's ``images=None`` choice.

A way of storing the pictures (a `Kind`: pixels, encoded pictures) is summed up by the bytes and reads an
epoch asks of the device per sample and by the rate the process's threads turn those bytes into
samples, measured on all of them at once (decoding does not scale with the cores: more threads than run
well are measured as such). An epoch is limited by the slower of the two: the threads, and, for an epoch
read from the device (a store that does not fit in the memory the page cache can give, or a first epoch),
what the device delivers (`DeviceRates`); plus the part of the faster that the two do not overlap
(`OVERLAP`).

>>> kind = Kind("pixels", "this store", bytes=45_000, reads={5_760_000: 1 / 128, 4096: 1 / 128}, cpu=9_000)
>>> device = DeviceRates(200e6, {5_760_000: 34.0, 4096: 3000.0}, in_flight=2)
>>> prediction = predict_epoch(kind, 120_000, device, from_device=True)
>>> round(prediction.rate), prediction.limit  # 938 chunks of pictures take 27.6 s, of labels 0.3 s; decoding 13 s
(3928, 'device')
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .device import DeviceRates
from .page_cache import Memory

# The share of the faster of reading and decoding that an epoch from the device does not hide behind the
# slower: local chunks are read by the threads that decode them (docs/benchmarks.md, "out of core",
# measures it with benchmarks/out_of_core.py).
OVERLAP = 0.2
LAYOUT_SHARE = 0.8  # a store whose chunks read at less than this share of the device's bandwidth is laid out wrong
GROWTH = 4  # how many times larger the chunks are that a store laid out wrong is measured with


@dataclass(frozen=True)
class Kind:
    """One way to store the pictures, as an epoch reads it: ``bytes`` from the device per sample, ``reads``
    per sample of each size (bytes → count), and ``cpu`` samples/s from memory on all the process's threads
    (``math.inf``: nothing to decode worth counting; with ``gpu``, the rate its pictures are decoded at on that
    device); ``source`` says where it was measured."""

    name: str
    source: str
    bytes: float
    reads: dict[int, float]
    cpu: float
    gpu: str | None = None

    def from_device(self, samples: int, memory: Memory) -> bool:
        """Whether every epoch of ``samples`` of this kind reads the device (they do not fit in the page cache).

        >>> Kind("pixels", "", bytes=49_152, reads={}, cpu=9_000).from_device(100_000, Memory(2**30, None))
        True
        """
        return not memory.holds(self.bytes * samples)


@dataclass(frozen=True)
class Prediction:
    """A kind's predicted epoch: ``rate`` samples/s, limited by ``limit`` (``"cores"``, ``"device"``)."""

    kind: Kind
    rate: float
    limit: str


def predict_epoch(kind: Kind, samples: int, device: DeviceRates | None, from_device: bool) -> Prediction:
    """An epoch of ``samples`` of ``kind``: at its threads' rate from memory, or, ``from_device`` (with a
    ``device`` measured), the slower of its threads and the device plus `OVERLAP` of the faster."""
    if device is None or not from_device:
        return Prediction(kind, kind.cpu, "cores")
    seconds = device.seconds({size: count * samples for size, count in kind.reads.items()})
    read = samples / seconds if seconds > 0 else math.inf  # a store too small to take the device any time
    slower, faster = sorted((1 / kind.cpu, 1 / read), reverse=True)
    return Prediction(kind, 1 / (slower + OVERLAP * faster), "device" if read < kind.cpu else "cores")

