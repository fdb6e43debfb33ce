"""Where the consumer of a cluster run takes the spans' batches from: straight from their workers, or
through the scheduler (Dask's default).

Over sockets (no shared memory: workers on other machines or in other containers, a full ``/dev/shm``,
``OUTCORE_SHARED_MEMORY=0``), a result taken through the scheduler goes from its worker to the scheduler
and on to the consumer: one process relays every batch of the cluster, and a ``LocalCluster`` runs it in
the consumer's process. Straight from the workers, batches arrive faster and cost the consumer less CPU
(`benchmarks/cluster.py` measures both; docs/benchmarks.md). So the consumer takes the
batches straight from the workers it reaches: those on its machine, and those elsewhere whose address
takes a connection (one tried per address, for `PROBE_SECONDS` at most, the answer kept for the
process's life). Where the client was told (``Client(..., direct_to_workers=...)``), that decides.
Should a worker not answer all the same, Dask takes what it could not get straight through the
scheduler.

>>> from types import SimpleNamespace
>>> straight_from_workers(SimpleNamespace(direct_to_workers=None), ["tcp://127.0.0.1:40001"])
True
>>> straight_from_workers(SimpleNamespace(direct_to_workers=False), ["tcp://127.0.0.1:40001"])
False
"""

from __future__ import annotations

import socket
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Any

PROBE_SECONDS = 0.5  # how long a worker's address may take to accept a connection, once per process


def straight_from_workers(client: Any, workers: Collection[str]) -> bool:
    """Whether the consumer takes the spans' batches straight from the ``workers`` (their addresses) rather
    than through the scheduler: as ``client.direct_to_workers`` says where it is set, else where it
    reaches every worker (on its machine, or accepting a connection)."""
    if client.direct_to_workers is not None:
        return bool(client.direct_to_workers)
    if not workers:
        return False
    elsewhere = [address for address in workers if not on_this_machine(address)]
    if not elsewhere:
        return True
    with ThreadPoolExecutor(min(16, len(elsewhere))) as pool:  # unknown addresses tried at once
        return all(pool.map(reachable, elsewhere))


def on_this_machine(address: str) -> bool:
    """Whether the Dask address ``address`` is on this machine (one of its network interfaces, or its name).

    >>> on_this_machine("tcp://127.0.0.1:8786"), on_this_machine("tcp://203.0.113.5:8786")
    (True, False)
    """
    from distributed.comm import get_address_host

    try:
        return get_address_host(address) in _local_hosts()
    except ValueError:  # an address of a kind that names no host, or another process's in-process one
        return False


@lru_cache(maxsize=4096)
def reachable(address: str) -> bool:
    """Whether the Dask address ``address`` (tcp or tls) takes a TCP connection from here within
    `PROBE_SECONDS`; kept for the process's life (a worker keeps its address)."""
    from distributed.comm import get_address_host_port

    try:
        host, port = get_address_host_port(address)
        with socket.create_connection((host, port), timeout=PROBE_SECONDS):
            return True
    except (OSError, ValueError):  # refused, unreachable, slow, or an address of another kind
        return False


@lru_cache(maxsize=1)
def _local_hosts() -> frozenset[str]:
    """The addresses of this machine's network interfaces (loopback included), and its names."""
    import psutil

    interfaces = {entry.address for entries in psutil.net_if_addrs().values() for entry in entries}
    return frozenset(interfaces | {"localhost", socket.gethostname()})
