"""outcore's C extensions, chosen at import: cropped JPEG decoding and resizing in C when it was built (see
setup.py), simplejpeg and Pillow otherwise; batches' samples and windows copied in C (`windows`, built
wherever a C compiler is), numpy otherwise. Both give the same pixels; `backend` and `copies` say which runs.

``OUTCORE_NATIVE=0`` in the environment turns the extensions off (to compare, or to rule them out).

>>> backend()  # doctest: +SKIP
'C extension (libjpeg-turbo 2.1.5; cropped decoding, AVX2 resize)'
"""

from __future__ import annotations

import os
import warnings

from ..errors import OutcoreWarning

ENVIRONMENT = "OUTCORE_NATIVE"

try:
    from . import _jpeg as extension
except ModuleNotFoundError as error:  # not built: no compiler or no libjpeg-turbo headers at install
    extension = None
    _why_not = f"not built ({error}; see setup.py: it needs libjpeg-turbo's headers and a C compiler)"
except ImportError as error:  # built, but it cannot load (libjpeg gone since, another interpreter's build)
    extension = None
    _why_not = f"built but cannot load ({error})"
    warnings.warn(OutcoreWarning(f"outcore's C extension {_why_not}: JPEGs are decoded whole with simplejpeg and "
                                 "Pillow (the same pixels, slower); reinstall outcore where libjpeg-turbo is"),
                  stacklevel=2)
else:
    _why_not = ""
try:
    from . import _windows as windows
except ImportError as error:  # not built (no C compiler at install), or built for another interpreter
    windows, _windows_why_not = None, f"not built or cannot load ({error})"
else:
    _windows_why_not = ""
if os.environ.get(ENVIRONMENT, "1") == "0":
    extension, _why_not = None, f"turned off by {ENVIRONMENT}=0"
    windows, _windows_why_not = None, _why_not


def backend() -> str:
    """What decodes JPEG boxes and resizes them in this process, in words (``outcore info --system``).

    >>> backend().split(" (")[0] in ("C extension", "simplejpeg and Pillow")
    True
    """
    if extension is None:
        return f"simplejpeg and Pillow ({_why_not})"
    return f"C extension (libjpeg-turbo {extension.LIBJPEG_TURBO_VERSION}; cropped decoding, {extension.SIMD} resize)"


def copies() -> str:
    """What copies batches' samples and windows out of chunks in this process, in words (``outcore info --system``).

    >>> copies().split(" (")[0] in ("C extension", "numpy")
    True
    """
    return "C extension (one call a run of samples, outside the GIL)" if windows else f"numpy ({_windows_why_not})"
