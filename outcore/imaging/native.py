"""outcore's C extensions, chosen at import: cropped JPEG decoding and resizing in C when it was built (see
setup.py), simplejpeg and Pillow otherwise; batches' samples and windows copied in C (`windows`, built
wherever a C compiler is), numpy otherwise. Both give the same pixels; `backend` and `copies` say which runs.

``OUTCORE_NATIVE=0`` in the environment turns the extensions off (to compare, or to rule them out).

>>> backend()  # doctest: +SKIP
'C extension (libjpeg-turbo 2.1.5; cropped decoding, AVX2 resize)'
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import warnings
from types import ModuleType

from ..errors import OutcoreWarning

ENVIRONMENT = "OUTCORE_NATIVE"


def _load(name: str, needs: str) -> tuple[ModuleType | None, str]:
    """This package's extension ``name``, or None and why not: not built (no such file: what building it
    ``needs``), or built but it cannot load (libjpeg gone since, another interpreter's build)."""
    try:
        if importlib.util.find_spec(f"{__package__}.{name}") is None:
            return None, f"not built: building it needs {needs} (see setup.py)"
        return importlib.import_module(f".{name}", __package__), ""
    except ImportError as error:
        return None, f"built but cannot load ({error})"


extension, _why_not = _load("_jpeg", "libjpeg-turbo's headers and a C compiler at install")
if _why_not.startswith("built"):
    warnings.warn(OutcoreWarning(f"outcore's C extension {_why_not}: JPEGs are decoded whole with simplejpeg and "
                                 "Pillow (the same pixels, slower); reinstall outcore where libjpeg-turbo is"),
                  stacklevel=2)
windows, _windows_why_not = _load("_windows", "a C compiler at install")
if os.environ.get(ENVIRONMENT, "1") == "0":
    extension, _why_not = None, f"turned off by {ENVIRONMENT}=0"
    windows, _windows_why_not = None, _why_not


def backend() -> str:
    """What decodes JPEG boxes (and plain PNGs) and resizes them in this process, in words (``outcore info
    --system``).

    >>> backend().split(" (")[0] in ("C extension", "simplejpeg and Pillow")
    True
    """
    if extension is None:
        return f"simplejpeg and Pillow ({_why_not})"
    zlib = getattr(extension, "ZLIB", "")  # empty: built without zlib, its PNGs decoded by Pillow
    pngs = f"PNGs with zlib {zlib}" if zlib else "PNGs by Pillow (built without zlib)"
    return (f"C extension (libjpeg-turbo {extension.LIBJPEG_TURBO_VERSION}; cropped decoding, {extension.SIMD} "
            f"resize; {pngs})")


def copies() -> str:
    """What copies batches' samples and windows out of chunks in this process, in words (``outcore info --system``).

    >>> copies().split(" (")[0] in ("C extension", "numpy")
    True
    """
    return "C extension (one call a run of samples, outside the GIL)" if windows else f"numpy ({_windows_why_not})"
