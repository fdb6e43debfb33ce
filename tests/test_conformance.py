"""outcore.testing's conformance suite, run against every kind of store."""

from __future__ import annotations

from outcore.testing import StoreConformance


class TestDirectoryStores(StoreConformance):
    kind = "directory"


class TestZipStores(StoreConformance):
    kind = "zip"


class TestURLStores(StoreConformance):
    kind = "url"
