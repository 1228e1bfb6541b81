"""A server's processes as Linux's /proc tells them: resident memory and open files of a process and all its
descendants (an engine process, `--http-workers`' workers), without psutil."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_PROC = Path("/proc")


@dataclass(frozen=True, slots=True)
class ProcessSample:
    pid: int
    name: str  # the command, e.g. "python -m voice_gateway.cli serve ..." cut to 120 characters
    rss_kib: int  # VmRSS
    fds: int  # entries of /proc/<pid>/fd


def _parent_pid(pid: int) -> int | None:
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after its last ")"
    return int(stat.rpartition(")")[2].split()[1])


def process_tree(root: int) -> list[int]:
    """`root` and every process below it, root first (the rest in pid order); empty once root is gone."""
    if not (_PROC / str(root)).exists():
        return []
    children: dict[int, list[int]] = {}
    for entry in os.listdir(_PROC):
        if entry.isdigit() and (parent := _parent_pid(int(entry))) is not None:
            children.setdefault(parent, []).append(int(entry))
    tree, frontier = [root], [root]
    while frontier:
        frontier = sorted(child for pid in frontier for child in children.get(pid, ()))
        tree += frontier
    return tree


def sample(pid: int) -> ProcessSample | None:
    """One process's memory and open files now; None if it has gone meanwhile."""
    base = _PROC / str(pid)
    try:
        status = (base / "status").read_text()
        fds = len(os.listdir(base / "fd"))
        name = (base / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None
    rss_kib = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return ProcessSample(pid=pid, name=name[:120], rss_kib=rss_kib, fds=fds)


def sample_tree(root: int) -> list[ProcessSample]:
    return [s for pid in process_tree(root) if (s := sample(pid)) is not None]
