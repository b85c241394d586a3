"""What the benches read about running processes from /proc (Linux): CPU time, peak
memory, and a sampler of a whole process tree (a command and everything it starts)."""

from __future__ import annotations

import os
import threading
from pathlib import Path


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (None when it cannot be read)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _cpu(fields: list[str]) -> float:
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process so far (0 when it cannot be read)."""
    fields = _stat(pid)
    return 0.0 if fields is None else _cpu(fields)


def peak_rss_mib(pid: int) -> float:
    """VmHWM of a live process, in MiB (0 when it cannot be read)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _processes() -> dict[int, tuple[int, float, str]]:
    """Every live process: pid -> (parent pid, CPU seconds so far, command line)."""
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = _stat(int(entry.name))
        try:
            cmdline = Path(f"/proc/{entry.name}/cmdline").read_bytes()
        except OSError:
            continue
        if fields is not None:
            found[int(entry.name)] = (int(fields[1]), _cpu(fields), cmdline.replace(
                b"\0", b" ").decode("utf-8", "replace"))
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
        processes = _processes()
        tree = {self.root}
        grew = True
        while grew:
            grew = False
            for pid, (parent, _, _) in processes.items():
                if parent in tree and pid not in tree:
                    tree.add(pid)
                    grew = True
        for pid in tree:
            if pid not in processes:
                continue
            _, cpu, command = processes[pid]
            if command:  # a process that has exited (a zombie) shows an empty one
                self.command[pid] = command
            else:
                self.command.setdefault(pid, command)
            self.cpu[pid] = max(self.cpu.get(pid, 0.0), cpu)
            self.peak[pid] = max(self.peak.get(pid, 0.0), peak_rss_mib(pid))

    def total_cpu(self) -> float:
        return sum(self.cpu.values())

    def cpu_of(self, marker: str) -> float:
        """The CPU seconds of the processes whose command line holds `marker`."""
        return sum(self.cpu[pid] for pid, command in self.command.items() if marker in command)

    def peak_of(self, marker: str) -> float:
        """The largest peak RSS among the processes whose command line holds `marker`."""
        return max((self.peak[pid] for pid, command in self.command.items()
                    if marker in command), default=0.0)
