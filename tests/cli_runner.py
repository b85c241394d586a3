"""Run the real `onceflow` command in a subprocess and check how it fails."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def onceflow(*args: str, env: dict[str, str] | None = None, stdin: str | None = None,
             cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`python -m onceflow.app.cli ARGS` with only the given ONCEFLOW_* settings."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ONCEFLOW_")}
    return subprocess.run([sys.executable, "-m", "onceflow.app.cli", *args],
                          input=stdin if stdin is not None else "", capture_output=True,
                          text=True, env={**clean, **(env or {})}, cwd=cwd, timeout=timeout)


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
