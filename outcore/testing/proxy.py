"""`FaultProxy`: an HTTP/1.1 proxy on loopback that puts a slow or failing network between a client and
an object store (moto's server, in the tests and benchmarks): added latency, a bandwidth cap, 5xx
answers, connection resets and stalls mid-body, each set while it runs. It also counts the requests
and bytes that went through, so tests can say what an epoch fetched.

It understands just enough HTTP for an S3 API: requests with a ``Content-Length`` body (or none), and
answers with a ``Content-Length``. Every socket has a timeout and every loop ends when the proxy is
closed: nothing it starts outlives it.

>>> with FaultProxy("127.0.0.1", moto_port) as proxy:  # doctest: +SKIP
...     proxy.latency = 0.02                 # 20 ms before each request is forwarded
...     proxy.bandwidth = 100e6              # bytes per second, all connections together
...     proxy.fail(2, status=503)            # the next two requests get "503 Slow Down"
...     ds = outcore.open_dataset("s3://data/train.zarr", storage_options={"endpoint": proxy.url})
"""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Self

SOCKET_SECONDS = 30.0  # the longest any socket of the proxy waits
PIECE = 64 * 1024  # bytes sent at a time (the bandwidth cap's grain)


@dataclass
class Traffic:
    """What went through the proxy: requests by method, GETs by object key, body bytes sent back, and the
    most requests it held at once (from receiving one until its answer is ready to send: once sent, the
    client may ask again before this count would see the answer go)."""

    requests: Counter = field(default_factory=Counter)
    gets: Counter = field(default_factory=Counter)
    ranges: Counter = field(default_factory=Counter)
    bytes_sent: int = 0
    in_flight: int = 0
    most_in_flight: int = 0


class FaultProxy:
    """Forwards HTTP requests from ``127.0.0.1:<port>`` to ``upstream_host:upstream_port``; see the module
    docstring. Use as a context manager, or call `close`."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.latency = 0.0
        self.bandwidth: float | None = None
        self.traffic = Traffic()
        self._faults: list[tuple[str, float]] = []  # ("status", 503) / ("reset", 0)
        self._stalls: list[tuple[float, int]] = []  # (seconds, the smallest answer body stalled)
        self._lock = threading.Lock()
        self._next_send = 0.0  # when the shared link is free again (the bandwidth cap)
        self._closed = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, name="fault-proxy", daemon=True)
        self._accepting.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def fail(self, count: int, status: int = 503) -> None:
        """Answer the next ``count`` requests with ``status`` instead of forwarding them."""
        self._add(count, ("status", status))

    def reset(self, count: int) -> None:
        """Close the connection of the next ``count`` requests without an answer."""
        self._add(count, ("reset", 0.0))

    def stall(self, count: int, seconds: float, smallest: int = 0) -> None:
        """Send half the body of the next ``count`` answers of ``smallest`` bytes or more, then nothing for
        ``seconds`` (then close). A ``smallest`` above a shard index's size stalls chunk reads only: a client
        may ask for an index twice at once (a read-ahead beside a read) and never wait for a stalled one."""
        with self._lock:
            self._stalls += [(seconds, smallest)] * count

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()
            self._stalls.clear()

    def close(self) -> None:
        self._closed.set()
        self._accepting.join(SOCKET_SECONDS)
        self._listener.close()
        for thread in list(self._threads):
            thread.join(SOCKET_SECONDS)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _add(self, count: int, fault: tuple[str, float]) -> None:
        with self._lock:
            self._faults += [fault] * count

    def _next_fault(self) -> tuple[str, float] | None:
        with self._lock:
            return self._faults.pop(0) if self._faults else None

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(client,), name="fault-proxy-connection", daemon=True)
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
            thread.start()

    def _serve(self, client: socket.socket) -> None:
        """Forward the requests of one client connection, one at a time, over one upstream connection."""
        client.settimeout(SOCKET_SECONDS)
        upstream = _Upstream(self.upstream)
        client_input = client.makefile("rb")
        try:
            while not self._closed.is_set():
                request = _read_message(client_input, head_only_body=False)
                if request is None:
                    return
                head, body = request
                method, target = head.split(b" ", 2)[:2]
                self._count(method.decode(), target.decode(), head)
                if not self._answer(client, upstream, head, body, method == b"HEAD"):
                    return
        except OSError:
            return
        finally:
            client_input.close()
            client.close()
            upstream.close()

    def _answer(self, client: socket.socket, upstream: _Upstream, head: bytes, body: bytes, is_head: bool) -> bool:
        """Answer one request, with the next fault if one is set; False when the connection is to end."""
        fault = self._next_fault()
        try:
            if fault is not None and fault[0] in ("reset", "status"):
                answer = None
            else:
                if self.latency:
                    time.sleep(self.latency)
                answer = upstream.ask(head + body, is_head)
        finally:  # answered: from here on the client may have it, and ask again before this thread runs on
            with self._lock:
                self.traffic.in_flight -= 1
        if fault is not None and fault[0] == "reset":
            client.shutdown(socket.SHUT_RDWR)
            return False
        if fault is not None and fault[0] == "status":
            self._answer_status(client, int(fault[1]))
            return True
        if answer is None:
            return False
        answer_head, answer_body = answer
        client.sendall(answer_head)
        stall = self._next_stall(len(answer_body))
        if stall is not None:
            self._send(client, answer_body[: len(answer_body) // 2])
            self._closed.wait(stall)
            return False
        self._send(client, answer_body)
        return True

    def _next_stall(self, size: int) -> float | None:
        """The seconds to stall an answer of ``size`` bytes for, if the next stall takes it."""
        with self._lock:
            if self._stalls and size >= self._stalls[0][1]:
                return self._stalls.pop(0)[0]
        return None

    def _count(self, method: str, target: str, head: bytes) -> None:
        with self._lock:
            self.traffic.in_flight += 1
            self.traffic.most_in_flight = max(self.traffic.most_in_flight, self.traffic.in_flight)
            self.traffic.requests[method] += 1
            if method == "GET":
                key = target.split("?", 1)[0]
                self.traffic.gets[key] += 1
                ranges = [line for line in head.split(b"\r\n") if line.lower().startswith(b"range:")]
                self.traffic.ranges[(key, ranges[0].split(b":", 1)[1].strip().decode() if ranges else "")] += 1

    def _answer_status(self, client: socket.socket, status: int) -> None:
        body = b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>SlowDown</Code><Message>injected</Message></Error>"
        client.sendall(f"HTTP/1.1 {status} Injected\r\nContent-Type: application/xml\r\nContent-Length: {len(body)}"
                       "\r\n\r\n".encode() + body)

    def _send(self, client: socket.socket, body: bytes) -> None:
        for start in range(0, len(body), PIECE):
            piece = body[start:start + PIECE]
            if self.bandwidth:
                with self._lock:
                    begin = max(time.monotonic(), self._next_send)
                    self._next_send = begin + len(piece) / self.bandwidth
                pause = begin - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
            client.sendall(piece)
            with self._lock:
                self.traffic.bytes_sent += len(piece)


class _Upstream:
    """One kept-alive connection to the upstream server, opened again when the server closed it."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.address = address
        self.socket: socket.socket | None = None
        self.input: Any = None

    def ask(self, request: bytes, is_head: bool) -> tuple[bytes, bytes] | None:
        """The upstream's answer to ``request`` (None: the upstream closed twice in a row)."""
        for _ in range(2):  # the upstream may have closed a kept-alive connection: open another
            if self.socket is None:
                self.socket = socket.create_connection(self.address, timeout=SOCKET_SECONDS)
                self.input = self.socket.makefile("rb")
            try:
                self.socket.sendall(request)
                answer = _read_message(self.input, head_only_body=is_head)
            except OSError:
                answer = None
            if answer is not None:
                return answer
            self.close()
        return None

    def close(self) -> None:
        if self.socket is not None:
            self.input.close()
            self.socket.close()
            self.socket = None


def _read_message(stream: object, *, head_only_body: bool) -> tuple[bytes, bytes] | None:
    """One HTTP message from ``stream``: its head (through the blank line) and its body (``Content-Length``
    bytes; none for the answer to a HEAD). None when the connection ends first."""
    lines = []
    while True:
        line = stream.readline(65536)  # type: ignore[attr-defined]
        if not line:
            return None
        lines.append(line)
        if line in (b"\r\n", b"\n"):
            break
        if len(lines) > 200:
            raise OSError("an HTTP head of over 200 lines")
    head = b"".join(lines)
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    body = b"" if head_only_body else stream.read(length)  # type: ignore[attr-defined]
    return head, body
