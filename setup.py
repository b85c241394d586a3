"""Build hook: compile the core (core/, imported as `onceflow`) with mypyc.

Everything else about the package is in pyproject.toml.  The core is plain, strictly typed
Python; mypyc turns the same source into C extension modules, which cuts the time a
document spends in the trigger semantics by about a fifth (bench/replay.py measures it).
Set ONCEFLOW_PURE_PYTHON=1 to install without compiling (no C compiler needed): the
behaviour is the same, only slower.

mypyc names modules after the folders they sit in, and the core sits in core/ but is
imported as `onceflow`, so the sources are staged under build/mypyc/onceflow/ first; the
extensions are named `onceflow.<module>` and land beside the sources in core/ (an editable
install) or in the wheel.
"""

from __future__ import annotations

import os
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
# Every module but errors.py, which holds the exception classes users raise and subclass
# (an interpreted class cannot subclass a compiled one): it stays interpreted.
COMPILED = [
    "calls", "decision", "durations", "engine", "envelope", "history", "ingress", "joins",
    "journal", "keys", "outputs", "partition", "pickling", "processor", "runners", "running",
    "values",
    "scenario", "scripted", "store", "tomltext", "triggers",
]
# The worker's per-record path outside the core: buffered table state, the outbox and its
# sender, the route wire format, record limits, sub-batches, fitting their outputs to the
# limit, the worker's counters (journal outcomes, service times), and the partition worker
# itself with its two mixins (mypyc traits: what it does with records it cannot decide,
# and control messages).  Plain typed Python too, compiled
# for the same reason (bench/partition.py and bench/instructions.py measure the worker's
# path against the core's).  Packages other than the core stay interpreted where they
# subclass or patch Faust and aiokafka classes.
COMPILED_WORKER = {
    "tables": ["state", "outbox"],
    "agents": ["wire", "limits", "batch", "clock", "fitting", "partition_worker", "rejects",
               "controls", "counters"],
}
# Modules the compiled ones import that stay interpreted (mypyc must still read them; the
# third-party packages they import are read as Any where pyproject.toml's [tool.mypy] says).
READ_ONLY_WORKER = {
    "tables": ["__init__", "raw_partition"],
    "agents": ["__init__", "signing", "context", "metrics", "topics", "held", "outputs"],
}


# pip runs this file once per build hook: for the requirements (egg_info), for the metadata
# (dist_info) and for the wheel.  Only the last compiles; mypyc's type analysis alone took
# about 2.4 s a run, twice for nothing.
METADATA_ONLY = {"egg_info", "dist_info", "sdist"}
BUILDS = {"bdist_wheel", "editable_wheel", "build", "build_ext", "install", "develop",
          "bdist", "bdist_egg"}


def metadata_only(argv: list[str]) -> bool:
    """Whether this run of setup.py only writes metadata (nothing is compiled then)."""
    words = set(argv[1:])
    return bool(words & METADATA_ONLY) and not words & BUILDS


def compiled_core() -> list:
    """The extension modules to build (none for a metadata-only run or a pure install)."""
    if metadata_only(sys.argv):
        return []
    # Old extensions go first, by unlinking: a process still running them keeps its
    # mapping (overwriting a loaded .so in place can crash it), and a pure install must
    # not leave compiled modules shadowing the sources.
    for folder in ("core", *COMPILED_WORKER):
        for old in (HERE / folder).glob("*.so"):
            old.unlink()
    if os.environ.get("ONCEFLOW_PURE_PYTHON", "") not in ("", "0"):
        return []
    from mypyc.build import mypycify

    stage = HERE / "build" / "mypyc" / "onceflow"
    if stage.exists():
        shutil.rmtree(stage)
    stage.mkdir(parents=True)
    for source in (HERE / "core").glob("*.py"):
        shutil.copy2(source, stage / source.name)
    worker_paths, readonly = [], []
    for package, names in COMPILED_WORKER.items():
        (stage / package).mkdir()
        for name in names + READ_ONLY_WORKER[package]:
            shutil.copy2(HERE / package / f"{name}.py", stage / package / f"{name}.py")
            (worker_paths if name in names else readonly).append(f"onceflow/{package}/{name}.py")
    previous = Path.cwd()
    os.chdir(stage.parent)  # mypyc's module names come from the paths it is given
    try:
        extensions = mypycify(
            # pyproject.toml's [tool.mypy] (strict, and the third-party packages read as
            # Any), named: the stage is outside the folders mypy would look in for it.
            [f"--config-file={HERE / 'pyproject.toml'}"]
            + [f"onceflow/{name}.py" for name in COMPILED]
            + ["onceflow/__init__.py", "onceflow/errors.py"] + worker_paths + readonly,
            only_compile_paths=[f"onceflow/{name}.py" for name in COMPILED] + worker_paths,
            group_name="onceflow._core",
            multi_file=True,
            target_dir=str(stage.parent / "c"),
        )
        # multi_file: a C file per module (the one file of all of them took gcc 26-31 s
        # alone, and cannot be split over cores).  mypyc writes the group's headers under
        # c/onceflow/ (the package part of the group name) while its C files include them
        # by bare name: the folder goes on the include path.
        for extension in extensions:
            extension.include_dirs.append(str(stage.parent / "c" / "onceflow"))
        return extensions
    finally:
        os.chdir(previous)


def build_jobs(setting: str | None) -> int:
    """How many C files to compile at once: ONCEFLOW_BUILD_JOBS, else the usable CPUs."""
    if not setting:
        return (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                else os.cpu_count() or 1)
    try:
        jobs = int(setting)
    except ValueError:
        jobs = 0
    if not 1 <= jobs <= 1024:
        raise SystemExit(f"onceflow: ONCEFLOW_BUILD_JOBS must be a whole number from 1 to "
                         f"1024 (how many C files to compile at once), not {setting[:40]!r}")
    return jobs


class ParallelBuildExt(build_ext):
    """build_ext that compiles the C files of one extension side by side, one per core.

    mypyc writes a C file per module (multi_file) into the one group extension, and
    distutils compiles an extension's files one after another.  This runs the compiler
    calls of `CCompiler.compile` (the same private steps it takes) on a thread pool.
    ONCEFLOW_BUILD_JOBS sets how many at once (default: the CPUs this process may use).
    """

    def build_extension(self, ext: Any) -> None:
        """Build one extension, its C files compiled on a thread pool."""
        compiler = self.compiler
        jobs = BUILD_JOBS
        if jobs <= 1 or len(ext.sources) <= 1:
            super().build_extension(ext)
            return
        serial = compiler.compile

        def compile_all(sources: list[str], output_dir: str | None = None,
                        macros: Any = None, include_dirs: Any = None, debug: bool = False,
                        extra_preargs: Any = None, extra_postargs: Any = None,
                        depends: Any = None) -> list[str]:
            macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
                output_dir, macros, include_dirs, sources, depends, extra_postargs)
            cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)

            def one(obj: str) -> None:
                source, suffix = build[obj]
                compiler._compile(obj, source, suffix, cc_args, extra_postargs, pp_opts)

            with ThreadPoolExecutor(jobs) as pool:
                list(pool.map(one, [obj for obj in objects if obj in build]))
            return objects

        compiler.compile = compile_all
        try:
            super().build_extension(ext)
        finally:
            compiler.compile = serial


# Read before compiled_core() unlinks the old modules: a bad setting stops the install
# with the checkout's compiled modules still in place.
BUILD_JOBS = build_jobs(os.environ.get("ONCEFLOW_BUILD_JOBS"))
setup(ext_modules=compiled_core(), cmdclass={"build_ext": ParallelBuildExt})
