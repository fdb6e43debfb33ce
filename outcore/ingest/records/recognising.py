"""What each record format knows of its files, used to recognise a source and to list the files it reads:
its name and suffixes, a folder that is one (an LMDB environment), a file that is one without a suffix
(ImageNet's TFRecord files), and which files of a source it reads.

>>> from outcore.ingest.records import TFRecord
>>> TFRecord.name, TFRecord.suffixes[0]
('tfrecord', '.tfrecord')
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from .locations import list_files

Source = str | os.PathLike | Sequence[str | os.PathLike]


class RecordFiles:
    """The defaults of a record format's files: known by their suffixes only; its stored values are the
    pictures' files as they are (`picture_of`)."""

    name: ClassVar[str]
    suffixes: ClassVar[tuple[str, ...]]

    @classmethod
    def is_folder_of(cls, folder: str) -> bool:
        """Whether ``folder`` (on this machine) is itself one source of this format, not a folder of its files."""
        return False

    @classmethod
    def is_file_of(cls, location: str, storage_options: Mapping[str, Any] | None = None) -> bool:
        """Whether a file without a known suffix holds this format (read from its first bytes)."""
        return False

    @classmethod
    def files(cls, source: Source, storage_options: Mapping[str, Any] | None = None) -> list[str]:
        """The files of ``source`` this format reads: those with its suffixes."""
        return list_files(source, cls.suffixes, storage_options)

    def picture_of(self) -> Callable[[bytes, bytes], bytes] | None:
        """What turns a stored value into the picture's bytes when it is read (None: the value is the picture)."""
        return None
