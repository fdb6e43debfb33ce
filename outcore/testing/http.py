"""`StaticServer`: a plain HTTP file server on loopback, as a web server or a CDN serves a store (read by
``outcore.open_dataset("https://...")``): GET and HEAD of the files under a folder, byte ranges, an ETag
per file and ``If-Match``, and nothing else. Every socket has a timeout; `close` ends it.

>>> with StaticServer("stores") as server:  # doctest: +SKIP
...     ds = outcore.open_dataset(f"{server.url}/train.zarr")
"""

from __future__ import annotations

import os
import re
import threading
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Self

SOCKET_SECONDS = 30.0
_RANGE = re.compile(r"bytes=(\d*)-(\d*)$")


class StaticServer:
    """Serves the files under ``root`` at ``http://127.0.0.1:<port>/``; use as a context manager."""

    def __init__(self, root: str | os.PathLike) -> None:
        handler = type("Handler", (_Handler,), {"root": Path(root).resolve()})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="static-server", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=SOCKET_SECONDS)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class _Handler(BaseHTTPRequestHandler):
    root: Path
    protocol_version = "HTTP/1.1"
    timeout = SOCKET_SECONDS

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def log_message(self, *_: object) -> None:  # quiet: a line per request otherwise
        pass

    def _answer(self, body: bool) -> None:
        path = Path(os.path.normpath(self.root / self.path.split("?", 1)[0].lstrip("/")))  # links followed
        if not path.is_relative_to(self.root) or not path.is_file():
            return self._status(404)
        stat = path.stat()
        etag = f'"{stat.st_size:x}-{stat.st_mtime_ns:x}"'
        if self.headers.get("If-Match") not in (None, "*", etag):
            return self._status(412)
        start, stop = 0, stat.st_size
        asked = self.headers.get("Range")
        if asked:
            match = _RANGE.match(asked.strip())
            if match is None or match.groups() == ("", ""):
                return self._status(416)
            first, last = match.groups()
            start, stop = ((stat.st_size - int(last), stat.st_size) if not first
                           else (int(first), min(stat.st_size, int(last) + 1 if last else stat.st_size)))
            if start >= stop or start < 0:
                return self._status(416)
        self.send_response(206 if asked else 200)
        self.send_header("Content-Length", str(stop - start))
        self.send_header("ETag", etag)
        self.send_header("Last-Modified", formatdate(stat.st_mtime, usegmt=True))
        self.send_header("Accept-Ranges", "bytes")
        if asked:
            self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{stat.st_size}")
        self.end_headers()
        if body:
            with open(path, "rb") as file:
                file.seek(start)
                self.wfile.write(file.read(stop - start))

    def _status(self, code: int) -> None:
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()
