"""This process's cgroups: the folders whose files say what its CPUs and memory are limited to.

``/proc/self/cgroup`` names one line per hierarchy: ``0::/path`` for v2's single hierarchy, and
``4:cpu,cpuacct:/path`` for each v1 controller's own. A limit set on any ancestor holds too, so every
folder from the process's own up to the hierarchy's root counts.

>>> [folder.name for folder, version in cgroup_folders("memory")][-1:]  # doctest: +SKIP
['memory']
"""

from __future__ import annotations

from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
OWN_CGROUP = Path("/proc/self/cgroup")  # which cgroup(s) this process is in


def cgroup_folders(controller: str) -> list[tuple[Path, int]]:
    """``(folder, version)`` for this process's cgroup of ``controller`` (``"cpu"``, ``"memory"``) and its
    ancestors, in v1's hierarchy of that controller and in v2's, innermost first; none when
    ``/proc/self/cgroup`` cannot be read (not Linux)."""
    try:
        lines = OWN_CGROUP.read_text().splitlines()
    except OSError:
        return []
    folders = []
    for line in lines:
        _, controllers, where = line.split(":", 2)
        if controllers == "":
            top, version = CGROUP_ROOT, 2
        elif controller in controllers.split(","):
            top, version = CGROUP_ROOT / controllers, 1
        else:
            continue
        folder = top / where.strip("/")
        folders += [(path, version) for path in (folder, *folder.parents) if path == top or top in path.parents]
    return folders
