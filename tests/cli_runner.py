"""Run the real `onceflow` command in a process of its own and check how it fails."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from forkserver import shared


def onceflow(*args: str, env: dict[str, str] | None = None, stdin: str | None = None,
             cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`python -m onceflow.app.cli ARGS` with only the given ONCEFLOW_* settings, as
    subprocess.run(capture_output=True, text=True) would give it.

    The process is a fork of the test process's fork server (tests/forkserver.py), or,
    with ONCEFLOW_TEST_FORKSERVER=0, started with subprocess.run.
    """
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ONCEFLOW_")}
    command = [sys.executable, "-m", "onceflow.app.cli", *args]
    server = shared()
    if server is None:
        return subprocess.run(command, input=stdin if stdin is not None else "",
                              capture_output=True, text=True, env={**clean, **(env or {})},
                              cwd=cwd, timeout=timeout)
    with tempfile.TemporaryDirectory(prefix="onceflow-cli-") as folder:
        files = {name: Path(folder) / name for name in ("stdin", "stdout", "stderr")}
        files["stdin"].write_text(stdin or "", encoding="utf-8")
        process = server.spawn(list(args), {**clean, **(env or {})}, files["stdout"],
                               stderr=files["stderr"], stdin=files["stdin"], cwd=cwd)
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise

        def text(path: Path) -> str:  # as text=True reads it: UTF-8, universal newlines
            data = path.read_bytes() if path.exists() else b""
            return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")

        return subprocess.CompletedProcess(command, code, text(files["stdout"]),
                                           text(files["stderr"]))


def one_line_error(result: subprocess.CompletedProcess[str], code: int, *says: str) -> str:
    """Assert one `onceflow: ...` line on stderr, exit `code`, no traceback; the line."""
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith("onceflow: "), line
    for part in says:
        assert part in line, line
    assert result.returncode == code, (result.returncode, line)
    return line
