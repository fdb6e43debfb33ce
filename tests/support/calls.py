"""How many Python functions a piece of work calls: a batch's Python work must not grow with its samples."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


def python_calls(make: Callable[[], Any]) -> int:
    """The Python functions (and calls into C) that ``make()`` calls on this thread."""
    calls = [0]

    def count(frame, event, arg):
        calls[0] += event in ("call", "c_call")

    sys.setprofile(count)
    try:
        make()
    finally:
        sys.setprofile(None)
    return calls[0]
