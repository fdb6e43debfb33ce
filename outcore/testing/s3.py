"""`S3Server`: a real S3 API on loopback (moto's server mode) for tests and benchmarks, and `upload` to put
a local store into it object by object.

>>> with S3Server() as server:  # doctest: +SKIP
...     server.create_bucket("data")
...     upload("train.zarr", "s3://data/train.zarr", server.options)
...     ds = outcore.open_dataset("s3://data/train.zarr", storage_options=server.options)
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Self

from ..errors import OptionError

CREDENTIALS = {"access_key_id": "testing", "secret_access_key": "testing", "region": "us-east-1"}


class S3Server:
    """moto's ``ThreadedMotoServer`` on ``127.0.0.1`` and a free port, in this process (pip install
    'moto[server]'). ``options`` are the ``storage_options`` that reach it; ``environment`` the
    ``AWS_*`` variables that do the same."""

    def __init__(self) -> None:
        try:
            from moto.server import ThreadedMotoServer
        except ImportError:
            raise OptionError("S3Server needs moto's server: pip install 'moto[server]'") from None
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request otherwise
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.host, self.port = host, port

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def options(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, **CREDENTIALS}

    @property
    def environment(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": CREDENTIALS["access_key_id"],
                "AWS_SECRET_ACCESS_KEY": CREDENTIALS["secret_access_key"], "AWS_REGION": CREDENTIALS["region"]}

    def create_bucket(self, name: str) -> None:
        import boto3  # moto's own dependency

        client = boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=CREDENTIALS["access_key_id"],
                              aws_secret_access_key=CREDENTIALS["secret_access_key"],
                              region_name=CREDENTIALS["region"])
        client.create_bucket(Bucket=name)

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def upload(local: str | os.PathLike, url: str, storage_options: dict[str, Any], threads: int = 8) -> int:
    """Copy every file of the local store folder ``local`` to ``url`` (``s3://bucket/prefix``), the
    metadata last, or a single-file store (a ``.zip``) to the object ``url``; returns the bytes sent."""
    from obstore import put
    from obstore.store import from_url

    root = Path(local)
    if root.is_file():
        parent, name = url.rsplit("/", 1)
        put(from_url(parent, client_options={"allow_http": True}, **storage_options), name, root)
        return root.stat().st_size
    store = from_url(url, client_options={"allow_http": True}, **storage_options)
    files = sorted((p for p in root.rglob("*") if p.is_file()), key=lambda p: p.name == "zarr.json")
    data = [p for p in files if p.name != "zarr.json"]
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda p: put(store, p.relative_to(root).as_posix(), p), data))
    for path in files[len(data):]:
        put(store, path.relative_to(root).as_posix(), path)
    return sum(p.stat().st_size for p in files)
