"""Podman for the container test: a Debian base made with mmdebstrap, the worker image.

Public image registries cannot be reached, so the base image is built from Debian's
packages (mmdebstrap) and loaded with `podman import`; deploy/Dockerfile takes it as its
BASE_IMAGE.  Both are cached: the base tar under ~/.cache/onceflow/containers, keyed by
the mmdebstrap command, and the images in podman's storage, tagged with a hash of what
they are built from (README.md aside), so a second run with the same sources builds
nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("ONCEFLOW_CACHE_DIR", Path.home() / ".cache" / "onceflow")) \
    / "containers"
# Python with venv (whose ensurepip brings pip), merged /usr made by mmdebstrap's hook rather
# than the usrmerge package (which pulls in perl), and no documentation, manual pages or
# translations: 130 MB instead of 248, and podman's vfs driver copies the base for each
# build stage, the image and every container made from it.
MMDEBSTRAP = ["mmdebstrap", "--variant=minbase", "--include=python3,python3-venv",
              "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
              "--dpkgopt=path-exclude=/usr/share/doc/*",
              "--dpkgopt=path-include=/usr/share/doc/*/copyright",
              "--dpkgopt=path-exclude=/usr/share/man/*",
              "--dpkgopt=path-exclude=/usr/share/locale/*", "bookworm"]
# What deploy/Dockerfile copies into the build (the rest is kept out by .dockerignore).
BUILD_INPUTS = ("pyproject.toml", "setup.py", "README.md", "core", "tables", "agents", "app",
                "pipeline")
BUILD_TIMEOUT = 1800.0


class PodmanError(AssertionError):
    """A podman command failed; the message has its output."""


def missing_tools() -> str | None:
    """Why the container test cannot run here, or None."""
    for tool in ("podman", "mmdebstrap", "runc"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install podman runc buildah mmdebstrap)"
    if os.geteuid() != 0:
        return "the container test runs podman as root (rootless podman is not set up)"
    return None


def digest(*parts: bytes) -> str:
    hashed = hashlib.sha256()
    for part in parts:
        hashed.update(len(part).to_bytes(8, "big"))
        hashed.update(part)
    return hashed.hexdigest()[:16]


def source_files() -> list[Path]:
    files = []
    for name in BUILD_INPUTS:
        path = ROOT / name
        candidates = [path] if path.is_file() else sorted(path.rglob("*"))
        files += [p for p in candidates if p.is_file() and "__pycache__" not in p.parts
                  and p.suffix not in (".so", ".pyc")]
    return files


# The overlay driver's own store: podman keeps one driver per store, and the default store
# may hold vfs images of earlier runs.
OVERLAY_ROOT = Path(os.environ.get("ONCEFLOW_TEST_PODMAN_ROOT",
                                   "/var/lib/containers/onceflow-overlay"))
DRIVER_ENV = "ONCEFLOW_TEST_PODMAN_DRIVER"  # overlay or vfs; unset: overlay when it mounts


def overlay_mounts(root: Path = OVERLAY_ROOT) -> bool:
    """Whether the kernel mounts an overlay file system on the store's file system.

    Not inside every sandbox: on a root that is itself an overlay (a container in a
    container) the mount is refused, and podman needs its vfs driver there.
    """
    try:
        if "overlay" not in Path("/proc/filesystems").read_text():
            return False
        root.mkdir(parents=True, exist_ok=True)
        probe = Path(tempfile.mkdtemp(prefix="probe-", dir=root))
    except OSError:
        return False
    try:
        dirs = {name: probe / name for name in ("lower", "upper", "work", "merged")}
        for path in dirs.values():
            path.mkdir()
        options = (f"lowerdir={dirs['lower']},upperdir={dirs['upper']},"
                   f"workdir={dirs['work']}")
        mounted = subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options,
                                  str(dirs["merged"])], capture_output=True, timeout=30)
        if mounted.returncode != 0:
            return False
        subprocess.run(["umount", str(dirs["merged"])], capture_output=True, timeout=30)
        return True
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        shutil.rmtree(probe, ignore_errors=True)


class Podman:
    """podman as root with the settings that work on these machines (cgroupfs, runc).

    Storage: the overlay driver where the kernel mounts it (in a store of its own), else
    vfs.  Under vfs every layer, image and container is a full copy of the file system: a
    build took 243 s against 71 with overlay here (2026-11-27, the same machine and
    load), and a cached one 130 s of copying against none; so the build uses its layer
    cache only on overlay, where a rebuild after a source change reuses the apt and
    dependency layers (39 s).
    """

    def __init__(self, workdir: Path) -> None:
        conf = workdir / "containers.conf"
        # The default ulimits (nofile) are refused inside the sandboxes CI runs in.
        conf.write_text("[containers]\ndefault_ulimits = []\n")
        self.env = {**os.environ, "CONTAINERS_CONF": str(conf)}
        driver = os.environ.get(DRIVER_ENV) or ("overlay" if overlay_mounts() else "vfs")
        if driver not in ("overlay", "vfs"):
            raise PodmanError(f"{DRIVER_ENV}={driver!r}: overlay or vfs")
        self.driver = driver
        store = (["--root", str(OVERLAY_ROOT / "storage"), "--runroot",
                  "/run/containers/onceflow-overlay"] if driver == "overlay" else [])
        self.base = ["podman", *store, f"--storage-driver={driver}",
                     "--cgroup-manager=cgroupfs", "--runtime", "runc"]
        self.timings: dict[str, float] = {}

    def run(self, *args: str, timeout: float = 300.0, check: bool = True
            ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([*self.base, *args], env=self.env, capture_output=True,
                              text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise PodmanError(f"podman {' '.join(args[:3])} ... exited {done.returncode}:\n"
                              f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return done

    def exists(self, image: str) -> bool:
        return self.run("image", "exists", image, check=False).returncode == 0

    def inspect(self, kind: str, name: str) -> dict[str, Any]:
        (found,) = json.loads(self.run(kind, "inspect", name).stdout)
        return dict(found)

    def base_image(self) -> str:
        """The Debian base, from the cached tar or a new mmdebstrap run."""
        key = digest(" ".join(MMDEBSTRAP).encode())
        tag = f"localhost/onceflow-base:{key}"
        if self.exists(tag):
            return tag
        tar = CACHE / f"base-{key}.tar"
        if not tar.exists():
            CACHE.mkdir(parents=True, exist_ok=True)
            partial = tar.with_suffix(".partial.tar")
            started = time.monotonic()
            done = subprocess.run([*MMDEBSTRAP, str(partial)], capture_output=True, text=True,
                                  timeout=BUILD_TIMEOUT)
            if done.returncode != 0:
                partial.unlink(missing_ok=True)
                raise PodmanError(f"mmdebstrap exited {done.returncode}:\n{done.stderr[-3000:]}")
            partial.rename(tar)
            self.timings["mmdebstrap"] = time.monotonic() - started
        started = time.monotonic()
        self.run("import", str(tar), tag, timeout=BUILD_TIMEOUT)
        self.timings["import"] = time.monotonic() - started
        return tag

    def worker_image(self) -> str:
        """deploy/Dockerfile built on the Debian base (docker format: it keeps HEALTHCHECK)."""
        base = self.base_image()
        # README.md goes into the image only as the package's long description: an edit
        # to the documentation alone does not make a new image to test (a build is about
        # 70 s here, and the README changes with most commits).
        files = [p for p in source_files() if p != ROOT / "README.md"]
        key = digest(base.encode(), (ROOT / "deploy" / "Dockerfile").read_bytes(),
                     (ROOT / ".dockerignore").read_bytes(),
                     *(str(p.relative_to(ROOT)).encode() + b"\0" + p.read_bytes()
                       for p in files))
        tag = f"localhost/onceflow:test-{key}"
        if self.exists(tag):
            return tag
        # pip in the build trusts what pip here trusts (a TLS-inspecting proxy's CA).
        bundle = Path(os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE")
                      or "/etc/ssl/certs/ca-certificates.crt")
        secret = ["--secret", f"id=pip-ca,src={bundle}"] if bundle.is_file() else []
        started = time.monotonic()
        layers = "--layers=true" if self.driver == "overlay" else "--layers=false"
        self.run("build", "--format", "docker", layers, "--network=host", *secret,
                 "--build-arg", f"BASE_IMAGE={base}", "--build-arg", f"REVISION={key}",
                 "-f", str(ROOT / "deploy" / "Dockerfile"), "-t", tag, str(ROOT),
                 timeout=BUILD_TIMEOUT)
        self.timings["build"] = time.monotonic() - started
        self.forget_other_builds(tag)
        return tag

    def forget_other_builds(self, keep: str) -> None:
        """Remove the test images of earlier sources (each is a full copy under vfs)."""
        listed = self.run("images", "--format", "{{.Repository}}:{{.Tag}}",
                          "localhost/onceflow").stdout.split()
        old = [image for image in listed if image.startswith("localhost/onceflow:test-")
               and image != keep]
        if old:
            self.run("rmi", "--force", *old, check=False)
        # Untagged images: the layers of those builds, and (overlay) the build cache of the
        # apt and dependency layers, which is kept for a day.
        keep_cache = ["--filter", "until=24h"] if self.driver == "overlay" else []
        self.run("image", "prune", "--force", *keep_cache, check=False)
