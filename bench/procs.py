"""What the benches read about running processes from /proc (Linux): CPU time, peak
memory, and a sampler of a whole process tree (a command and everything it starts)."""

from __future__ import annotations

import os
import threading
from pathlib import Path


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process so far (0 when it cannot be read)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid: int) -> float:
    """VmHWM of a live process, in MiB (0 when it cannot be read)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _parents() -> dict[int, tuple[int, str]]:
    """Every live process: pid -> (parent pid, command line)."""
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()
            cmdline = Path(f"/proc/{entry.name}/cmdline").read_bytes()
        except (OSError, IndexError):
            continue
        found[int(entry.name)] = (int(stat[1]), cmdline.replace(b"\0", b" ").decode(
            "utf-8", "replace"))
    return found


class TreeSampler:
    """Samples a process and all its descendants until stopped.

    Keeps, for every process seen, its last CPU time and its peak RSS (VmHWM): the sum of
    the CPU times is what the tree spent up to the last sample (a process that ends between
    two samples loses at most one interval).
    """

    def __init__(self, root: int, interval: float = 0.2) -> None:
        self.root = root
        self.interval = interval
        self.cpu: dict[int, float] = {}
        self.peak: dict[int, float] = {}
        self.command: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> TreeSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def sample(self) -> None:
        processes = _parents()
        tree = {self.root}
        grew = True
        while grew:
            grew = False
            for pid, (parent, _) in processes.items():
                if parent in tree and pid not in tree:
                    tree.add(pid)
                    grew = True
        for pid in tree:
            if pid not in processes:
                continue
            self.command[pid] = processes[pid][1]
            self.cpu[pid] = max(self.cpu.get(pid, 0.0), cpu_seconds(pid))
            self.peak[pid] = max(self.peak.get(pid, 0.0), peak_rss_mib(pid))

    def total_cpu(self) -> float:
        return sum(self.cpu.values())

    def peak_of(self, marker: str) -> float:
        """The largest peak RSS among the processes whose command line holds `marker`."""
        return max((self.peak[pid] for pid, command in self.command.items()
                    if marker in command), default=0.0)
