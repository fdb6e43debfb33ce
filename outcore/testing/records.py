"""Record files written by the real libraries of each format, from a list of picture files and labels:
for tests and benchmarks of `outcore.ingest_records` (each writer imports its library when called).

>>> files = write_image_folder("photos", 10)  # doctest: +SKIP
>>> write_tfrecords(files, [f.parent.name for f in files], "tfrecords", shards=2)  # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

CAFFE_DATUM_FIELDS = (  # caffe.proto's Datum: (name, number, type, repeated)
    ("channels", 1, "TYPE_INT32", False), ("height", 2, "TYPE_INT32", False), ("width", 3, "TYPE_INT32", False),
    ("data", 4, "TYPE_BYTES", False), ("label", 5, "TYPE_INT32", False), ("float_data", 6, "TYPE_FLOAT", True),
    ("encoded", 7, "TYPE_BOOL", False),
)


def _shards(count: int, shards: int) -> list[range]:
    edges = np.linspace(0, count, shards + 1).astype(int)
    return [range(edges[i], edges[i + 1]) for i in range(shards)]


def write_tfrecords(files: Sequence[str | os.PathLike], classes: Sequence[str], folder: str | os.PathLike, *,
                    shards: int = 2, compression: str = "") -> list[Path]:
    """ImageNet-style ``tf.train.Example`` records (``image/encoded``, ``image/class/label`` (the class's
    index among the sorted names), ``image/class/text``, ``image/filename``) written by TensorFlow's
    ``TFRecordWriter``, ``compression`` ``""`` or ``"GZIP"``."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    names = sorted(set(classes))
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for s, rows in enumerate(_shards(len(files), shards)):
        path = folder / f"train-{s:05d}-of-{shards:05d}.tfrecord{'.gz' if compression else ''}"
        with tf.io.TFRecordWriter(str(path), tf.io.TFRecordOptions(compression_type=compression)) as writer:
            for i in rows:
                feature = {
                    "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[Path(files[i]).read_bytes()])),
                    "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(
                        value=[names.index(classes[i])])),
                    "image/class/text": tf.train.Feature(bytes_list=tf.train.BytesList(value=[classes[i].encode()])),
                    "image/filename": tf.train.Feature(bytes_list=tf.train.BytesList(value=[str(files[i]).encode()])),
                }
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
        written.append(path)
    return written


def write_webdataset(files: Sequence[str | os.PathLike], classes: Sequence[str], folder: str | os.PathLike, *,
                     per_shard: int = 20) -> str:
    """WebDataset shards by ``webdataset.ShardWriter``: ``key.jpg`` (or ``.png``), ``key.cls`` (the
    class's index) and ``key.json`` (``{"class": name}``); returns the brace pattern naming them."""
    import webdataset

    names = sorted(set(classes))
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with webdataset.ShardWriter(str(folder / "shard-%06d.tar"), maxcount=per_shard, verbose=0) as sink:
        for i, file in enumerate(files):
            extension = Path(file).suffix.lstrip(".").lower()
            sink.write({"__key__": f"sample{i:06d}", extension: Path(file).read_bytes(),
                        "cls": names.index(classes[i]), "json": {"class": classes[i]}})
    count = len(list(folder.glob("shard-*.tar")))
    return str(folder / f"shard-{{000000..{count - 1:06d}}}.tar")


def datum_class() -> Any:
    """Caffe's ``Datum`` message class, made with protobuf from caffe.proto's field numbers."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    proto = descriptor_pb2.FileDescriptorProto(name="outcore_caffe_datum.proto", package="caffe", syntax="proto2")
    message = proto.message_type.add(name="Datum")
    for name, number, kind, repeated in CAFFE_DATUM_FIELDS:
        message.field.add(name=name, number=number, type=getattr(descriptor_pb2.FieldDescriptorProto, kind),
                          label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED if repeated
                          else descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("caffe.Datum"))


def write_lmdb(files: Sequence[str | os.PathLike], classes: Sequence[str], path: str | os.PathLike, *,
               values: str = "bytes") -> Path:
    """An LMDB environment by ``lmdb``: keys ``<class>/<index>``; values the files' bytes (``"bytes"``),
    Caffe Datums of the encoded files (``"datum"``) or of their raw pixels, channels first in BGR order
    as Caffe's ``convert_imageset`` writes them (``"raw"``)."""
    import lmdb

    names = sorted(set(classes))
    datum = datum_class() if values != "bytes" else None
    total = sum(Path(f).stat().st_size for f in files)
    environment = lmdb.open(str(path), map_size=max(2**24, 64 * total))
    with environment.begin(write=True) as transaction:
        for i, file in enumerate(files):
            data = Path(file).read_bytes()
            if datum is None:
                value = data
            elif values == "datum":
                value = datum(data=data, label=names.index(classes[i]), encoded=True).SerializeToString()
            else:
                pixels = np.asarray(Image.open(file).convert("RGB"))[..., ::-1].transpose(2, 0, 1)
                value = datum(channels=3, height=pixels.shape[1], width=pixels.shape[2], data=pixels.tobytes(),
                              label=names.index(classes[i])).SerializeToString()
            transaction.put(f"{classes[i]}/{i:06d}".encode(), value)
    environment.close()
    return Path(path)


def write_hf_parquet_of_paths(paths: Sequence[str], classes: Sequence[str], path: str | os.PathLike) -> Path:
    """A Hugging Face dataset of pictures given by their ``paths`` (as the user gave them: absolute or
    relative), written with ``to_parquet``: ``datasets`` stores each as ``{bytes: null, path}``."""
    import datasets

    names = sorted(set(classes))
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=names)})
    dataset = datasets.Dataset.from_dict({"image": [str(p) for p in paths], "label": [names.index(c) for c in classes]},
                                         features=features)
    dataset.to_parquet(str(path))
    return Path(path)


def write_hf_dataset(files: Sequence[str | os.PathLike], classes: Sequence[str], folder: str | os.PathLike, *,
                     parquet_shards: int = 2) -> tuple[Path, list[Path]]:
    """A Hugging Face dataset (``image``: ``datasets.Image``, ``label``: ``ClassLabel``) saved with
    ``save_to_disk`` into ``folder/saved`` and with ``to_parquet`` as ``parquet_shards`` files."""
    import datasets

    names = sorted(set(classes))
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=names)})
    dataset = datasets.Dataset.from_dict(
        {"image": [{"bytes": Path(f).read_bytes(), "path": Path(f).name} for f in files],
         "label": [names.index(c) for c in classes]}, features=features)
    folder = Path(folder)
    dataset.save_to_disk(str(folder / "saved"))
    parquet = []
    for s in range(parquet_shards):
        path = folder / f"train-{s:05d}-of-{parquet_shards:05d}.parquet"
        dataset.shard(parquet_shards, s, contiguous=True).to_parquet(str(path))
        parquet.append(path)
    return folder / "saved", parquet
