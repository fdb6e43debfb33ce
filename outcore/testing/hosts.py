"""`Hosts`: several machines emulated on one, for tests of what crosses a network (Linux, as root).

Each host is a network namespace with an address of its own on a bridge (in a namespace of its own too:
the machine's own network is left as it is), and each process started on a host runs in a mount namespace
where ``/dev/shm`` is the host's own (a tmpfs), ``TMPDIR`` and ``HOME`` are the host's own folders, and
its hostname (``host0``, ``host1``, ...) its own, which every host resolves (``/etc/hosts``), as on
separate machines: a process on one host reaches the others only through their addresses, and sees
their shared memory, scratch folders and home (outcore's default staging and cache folders) not at all.
Every other folder (a store every host reads, as over NFS) is shared. Processes are started with the
commands users type (``dask scheduler``, ``dask worker ADDRESS``, ``torchrun``, ``outcore ingest``);
`Host.cut` takes a host's link down, as a machine that vanishes without closing its connections.

A pytest fixture of three hosts, and a test that trains on host 2 against a cluster on hosts 0 and 1:

>>> @pytest.fixture  # doctest: +SKIP
... def hosts(tmp_path):
...     why = unavailable()
...     if why:
...         pytest.skip(why)
...     with Hosts(3, tmp_path / "hosts") as made:
...         yield made
>>> scheduler = hosts.start_dask(scheduler=0, workers=[1])  # "tcp://host0:8786"  # doctest: +SKIP
>>> done = hosts[2].run([sys.executable, "train.py", scheduler], timeout=120)  # doctest: +SKIP
>>> hosts[1].cut()  # host 1 vanishes  # doctest: +SKIP
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Self
from uuid import uuid4

from ..errors import OptionError
from ..iterate.cluster import worker_environment

SUBNET = "10.88.0"  # hosts are SUBNET.1, SUBNET.2, ...: addresses inside the namespaces Hosts makes only
INTERFACE = "eth0"  # each host's link to the bridge


def unavailable() -> str | None:
    """Why `Hosts` cannot run here (not root, not Linux, no ``ip`` or network namespaces), or None."""
    if not sys.platform.startswith("linux"):
        return "emulated hosts need Linux network and mount namespaces"
    if os.geteuid() != 0:
        return "emulated hosts need root (network and mount namespaces): run the tests as root, as CI does"
    for tool in ("ip", "mount", "umount", "unshare", "hostname"):
        if shutil.which(tool) is None:
            return f"emulated hosts need {tool!r} (Debian: iproute2, mount)"
    probe = f"outcore-probe-{uuid4().hex[:8]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=False)
    if made.returncode:
        return f"cannot make a network namespace here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True, check=False)
    return None


class Host:
    """One emulated machine: ``address`` on the hosts' network, its own ``/dev/shm`` (``shm``, seen from
    outside at that folder), ``tmp`` (its ``TMPDIR``: Dask's scratch folders) and ``home`` (its ``HOME``:
    outcore's default staging and cache folders)."""

    def __init__(self, index: int, namespace: str, root: Path, names: Path) -> None:
        self.index, self.namespace, self.root, self.names = index, namespace, root, names
        self.name = f"host{index}"
        self.address = f"{SUBNET}.{index + 1}"
        self.shm, self.home = root / "shm", root / "home"
        self.tmp = Path(tempfile.mkdtemp(prefix=f"outcore-{self.name}-"))  # short: forkserver's socket lives there
        self.processes: list[subprocess.Popen] = []

    def __repr__(self) -> str:
        return f"Host({self.name}, {self.address})"

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` as run on this host: in its network namespace, with its hostname, ``/etc/hosts`` and
        ``/dev/shm``."""
        setup = 'hostname "$0" && mount --bind "$1" /dev/shm && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"'
        return ["ip", "netns", "exec", self.namespace, "unshare", "--uts", "sh", "-c", setup, self.name,
                str(self.shm), str(self.names), *argv]

    def environment(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """This process's environment, with the host's ``TMPDIR`` and ``HOME``, and ``extra``."""
        return {**os.environ, "TMPDIR": str(self.tmp), "HOME": str(self.home), **(extra or {})}

    def start(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, log: Path | None = None,
              cwd: Path | None = None) -> subprocess.Popen:
        """Start ``argv`` on this host (in a session of its own; stopped with the hosts), its output into
        ``log`` (default: ``<host folder>/<program>-<n>.log``)."""
        log = log or self.root / f"{Path(argv[0]).name}-{len(self.processes)}.log"
        with open(log, "ab") as output:
            process = subprocess.Popen(self.command(argv), env=self.environment(env), stdout=output,
                                       stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True)
        process.log = log  # type: ignore[attr-defined]
        self.processes.append(process)
        return process

    def run(self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess:
        """Run ``argv`` on this host to its end (at most ``timeout`` seconds: then it is killed and
        ``subprocess.TimeoutExpired`` raised), its output captured."""
        process = subprocess.Popen(self.command(argv), env=self.environment(env), stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, cwd=cwd, start_new_session=True)
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill(process)
            output, _ = process.communicate()
            raise subprocess.TimeoutExpired(argv, timeout, output) from None
        return subprocess.CompletedProcess(argv, process.returncode, output)

    def cut(self) -> None:
        """Take this host's link down: its connections neither answer nor close, as a machine that vanished."""
        self._link("down")

    def mend(self) -> None:
        """Bring this host's link back up."""
        self._link("up")

    def _link(self, state: str) -> None:
        _ip("-n", self.namespace, "link", "set", INTERFACE, state)

    def stop(self) -> None:
        """Kill what was started on this host (each process's whole session)."""
        for process in self.processes:
            _kill(process)
        self.processes.clear()


class Hosts:
    """``count`` emulated hosts (`Host`) on a bridge, each with a folder of its own under ``root``; a context
    manager (or `close`) that removes the namespaces and mounts and kills what was started on them.
    ``shm_size`` is each host's ``/dev/shm``."""

    def __init__(self, count: int, root: str | os.PathLike, *, shm_size: str = "512m") -> None:
        why = unavailable()
        if why is not None:
            raise OptionError(why)
        if not 1 <= count <= 250:
            raise OptionError(f"count={count}: 1 to 250 hosts")
        token = uuid4().hex[:6]
        self.switch = f"outcore-{token}-switch"
        self.hosts: list[Host] = []
        self._mounted: list[Path] = []
        names = Path(root) / "hosts"  # every host's /etc/hosts
        names.parent.mkdir(parents=True, exist_ok=True)
        names.write_text("127.0.0.1 localhost\n" + "".join(f"{SUBNET}.{i + 1} host{i}\n" for i in range(count)))
        try:
            _ip("netns", "add", self.switch)
            _ip("-n", self.switch, "link", "add", "bridge0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "bridge0", "up")
            for index in range(count):
                host = Host(index, f"outcore-{token}-{index}", Path(root) / f"host{index}", names)
                self.hosts.append(host)
                self._wire(host, f"port{index}")
                for folder in (host.shm, host.home):
                    folder.mkdir(parents=True, exist_ok=True)
                subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={shm_size},mode=1777", "tmpfs", str(host.shm)],
                               check=True, capture_output=True)
                self._mounted.append(host.shm)
        except BaseException:
            self.close()
            raise

    def _wire(self, host: Host, port: str) -> None:
        """The host's namespace, its link to the bridge and its address."""
        _ip("netns", "add", host.namespace)
        _ip("link", "add", INTERFACE, "netns", host.namespace, "type", "veth", "peer", "name", port,
            "netns", self.switch)
        _ip("-n", self.switch, "link", "set", port, "master", "bridge0", "up")
        _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", INTERFACE)
        _ip("-n", host.namespace, "link", "set", INTERFACE, "up")
        _ip("-n", host.namespace, "link", "set", "lo", "up")

    def start_dask(self, scheduler: int = 0, workers: Sequence[int] = (1, 2), *, threads: int = 1, port: int = 8786,
                   env: Mapping[str, str] | None = None) -> str:
        """``dask scheduler`` on host ``scheduler`` and ``dask worker ADDRESS`` (``threads`` threads, outcore's
        worker settings and ``env`` in its environment) on each host of ``workers``; the scheduler's address
        (by the host's name, which every host resolves)."""
        address = f"tcp://{self[scheduler].name}:{port}"
        self[scheduler].start([command("dask"), "scheduler", "--host", self[scheduler].name, "--port", str(port),
                               "--no-dashboard"])
        for index in workers:
            self[index].start([command("dask"), "worker", address, "--host", self[index].name, "--nthreads",
                               str(threads), "--no-dashboard"], env={**worker_environment(), **(env or {})})
        return address

    def __getitem__(self, index: int) -> Host:
        return self.hosts[index]

    def __iter__(self) -> Iterator[Host]:
        return iter(self.hosts)

    def __len__(self) -> int:
        return len(self.hosts)

    def close(self) -> None:
        for host in self.hosts:
            host.stop()
        for folder in self._mounted:
            subprocess.run(["umount", "-l", str(folder)], capture_output=True, check=False)
        self._mounted.clear()
        for namespace in [host.namespace for host in self.hosts] + [self.switch]:
            subprocess.run(["ip", "netns", "delete", namespace], capture_output=True, check=False)
        for host in self.hosts:
            shutil.rmtree(host.tmp, ignore_errors=True)
        self.hosts.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def command(name: str) -> str:
    """The command ``name`` (``dask``, ``outcore``, ``torchrun``) of this Python's environment, else the PATH's."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else name


def wait_for(condition, seconds: float, what: str, interval: float = 0.1) -> None:
    """Poll ``condition()`` until it is true; after ``seconds``, a ``TimeoutError`` naming ``what``."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {seconds:.0f} s")
        time.sleep(interval)


def _ip(*arguments: str) -> None:
    done = subprocess.run(["ip", *arguments], capture_output=True, text=True, check=False)
    if done.returncode:
        raise OSError(f"ip {' '.join(arguments)}: {done.stderr.strip()}")


def _kill(process: subprocess.Popen) -> None:
    """Kill ``process``'s session (the namespace wrapper execs into the command; its children follow)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)  # its session's processes, even where the first has ended
    except ProcessLookupError:
        pass
    process.wait()
