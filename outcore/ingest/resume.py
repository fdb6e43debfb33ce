"""An ingest onto a store that is already there: the same ingest finished it (a script or notebook run
again, a kill that landed after the commit, a cron job run twice, a ``resume=True``), or another made it.

An image ingest records its *manifest* (its files with their sizes and modification times, its labels and
every setting: `outcore.ingest.images`) in the store's provenance. A run whose manifest is the finished
store's returns that store, saying so, instead of refusing it for want of ``overwrite=True`` (which would
ingest everything again); one whose manifest differs is refused, saying what differs.

>>> manifest_differences({"files": 3, "settings": {"shape": "(64, 64, 3)"}},
...                      {"files": 3, "settings": {"shape": "(32, 32, 3)"}})
['shape was (64, 64, 3), now (32, 32, 3)']
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from typing import Any

from ..errors import NotAStoreError, OutcoreWarning, StoreExistsError
from ..storage import is_url, open_group, redact
from ..storage.safety import read_attrs


def resume_finished(location: str | os.PathLike, manifest: Mapping[str, Any],
                    storage_options: Mapping[str, Any] | None, resume: bool = False) -> bool:
    """Whether the store at ``location`` is the one a run of ``manifest`` makes, finished: true (with an
    `OutcoreWarning` saying so) when it is; false when there is no store there; a `StoreExistsError`
    naming what differs when another ingest made it (``resume``: the run was asked to resume)."""
    shown = _shown(location)
    there, made = _recorded(location, storage_options)
    if not there:
        return False
    differences = manifest_differences(made, manifest)
    if differences:
        raise StoreExistsError(f"{shown} already exists and was not made by this ingest ({'; '.join(differences)})"
                               f"{', so there is nothing to resume' if resume else ''}: pass overwrite=True to "
                               "replace it")
    warnings.warn(f"{shown} is already complete (an ingest of the same files, labels and settings finished it): "
                  f"{'nothing to resume' if resume else 'it is returned as it is'}", OutcoreWarning, stacklevel=4)
    return True


def images_chosen_before(location: str | os.PathLike, storage_options: Mapping[str, Any] | None) -> str | None:
    """The ``images=`` an earlier ingest wrote the store at ``location`` with (None: no store there, or
    not an image ingest's): what ``images=None`` means for a run that may be the same ingest again."""
    made = _recorded(location, storage_options)[1]
    images = ((made or {}).get("settings") or {}).get("images") if isinstance(made, Mapping) else None
    return images.strip("'") if isinstance(images, str) else None


def _recorded(location: str | os.PathLike, storage_options: Mapping[str, Any] | None) -> tuple[bool, Any]:
    """Whether a store is at ``location``, and the manifest its ingest recorded in its provenance."""
    try:
        group = open_group(location, mode="r", storage_options=storage_options)
    except NotAStoreError:
        return False, None
    return True, read_attrs(group, _shown(location)).provenance.get("manifest")


def _shown(location: str | os.PathLike) -> str:
    return redact(str(location)) if is_url(location) else str(location)


def manifest_differences(made: Any, wanted: Mapping[str, Any]) -> list[str]:
    """What tells the manifest of the run that ``made`` a store from the one ``wanted`` now, in words."""
    if not isinstance(made, Mapping) or made.get("ingest") != wanted.get("ingest"):
        return ["it records no manifest of an ingest like this one"]
    differences = []
    if made.get("files") != wanted.get("files"):
        differences.append(f"{made.get('files')} files then, {wanted.get('files')} now")
    elif made.get("fingerprint") != wanted.get("fingerprint"):
        differences.append("its files differ (other paths, or files whose size or modification time changed)")
    if made.get("labels") != wanted.get("labels"):
        differences.append("its labels or class names differ")
    settings, now = made.get("settings") or {}, wanted.get("settings") or {}
    differences += [f"{name} was {settings.get(name)}, now {now.get(name)}"
                    for name in sorted(set(settings) | set(now)) if settings.get(name) != now.get(name)]
    return differences
