"""The ``outcore`` command and its reports: ``ingest``, ``info``, ``verify``, ``bench`` and ``demo``."""

from .info import describe
from .main import main
from .verify import VerifyReport, verify

__all__ = ["VerifyReport", "describe", "main", "verify"]
