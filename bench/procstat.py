"""A server's processes as Linux's /proc tells them: resident memory, open files and CPU time of a process
and all its descendants (an engine process, `--http-workers`' workers, a local Ray instance's daemons
and replicas), without psutil."""

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
    cpu_s: float = 0.0  # user and system time so far
    role: str = "?"  # what it runs (`role`), read from its whole command


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
        stat = (base / "stat").read_text()
        fds = len(os.listdir(base / "fd"))
        name = (base / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None
    rss_kib = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    utime, stime = stat.rpartition(")")[2].split()[11:13]
    cpu_s = (int(utime) + int(stime)) / os.sysconf("SC_CLK_TCK")
    return ProcessSample(pid=pid, name=name[:120], rss_kib=rss_kib, fds=fds, cpu_s=cpu_s, role=role(name))


def sample_tree(root: int) -> list[ProcessSample]:
    return [s for pid in process_tree(root) if (s := sample(pid)) is not None]


def cpu_by_process(before: list[ProcessSample], after: list[ProcessSample]) -> dict[str, float]:
    """CPU seconds each process of a tree spent between two samples of it, by what it runs (`role`),
    most first; a process that started between them counts from zero, one that ended is not seen."""
    start = {s.pid: s.cpu_s for s in before}
    spent: dict[str, float] = {}
    for s in after:
        spent[s.role] = spent.get(s.role, 0.0) + s.cpu_s - start.get(s.pid, 0.0)
    return dict(sorted(((k, round(v, 2)) for k, v in spent.items()), key=lambda kv: -kv[1]))


def role(command: str) -> str:
    """A short name for what a process runs: Ray's title for its workers ("ray::ReplicaActor"), a
    Python program's module or script ("voice_gateway.cli serve", "log_monitor.py"), else the binary's
    name ("raylet")."""
    words = command.split()
    if not words:
        return "?"
    if words[0].startswith("ray::"):
        return words[0]
    program = os.path.basename(words[0])
    if not program.startswith("python"):
        return program
    rest = [w for w in words[1:] if not w.startswith("-") or w in ("-m", "-c")]
    if rest[:1] == ["-m"] and len(rest) > 1:
        return " ".join(rest[1:3])
    if rest[:1] == ["-c"]:
        return "multiprocessing child" if "multiprocessing" in command else "python -c"
    script = next((w for w in rest if w.endswith(".py")), None)
    return os.path.basename(script) if script is not None else program
