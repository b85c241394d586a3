"""Benchmark: this working copy's `onceflow replay` against another revision's, alternately.

On a machine whose speed moves by a fifth between runs minutes apart, one run of each
build says little.  This builds the other revision's wheel (compiled as `pip install`
compiles it) into a temporary folder, then runs `onceflow replay` on one generated
scenario with each build in turn, pinned to one core, and prints the best and the mean
CPU seconds of each, their ratio, and whether both wrote the same journal, byte for byte.
The other build runs with its package first on PYTHONPATH, ahead of this checkout's
editable install.

    .venv/bin/python bench/compare.py [--base HEAD] [--runs 10] [--documents 300000]

The working copy must be installed (`make test` or `pip install -e .` compiles it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from generate import generate_lines, write_scenario  # noqa: E402
from replay import run_replay  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def build_base(revision: str, folder: Path) -> Path:
    """The revision's wheel, unpacked: a folder to put first on PYTHONPATH."""
    source = folder / "source"
    source.mkdir()
    if revision.startswith("-"):  # git would read it as an option (--output=...)
        raise SystemExit(f"bench/compare.py: {revision!r} is not a revision")
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision],
                             capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"bench/compare.py: {revision!r} is not a revision of this "
                         f"repository: {archive.stderr.decode(errors='replace').strip()}")
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True)
    wheels = folder / "wheels"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                            "--wheel-dir", str(wheels), str(source)],
                           capture_output=True, text=True)
    if built.returncode != 0:
        raise SystemExit(f"building {revision} failed:\n{built.stdout}{built.stderr}")
    package = folder / "package"
    (wheel,) = wheels.glob("onceflow-*.whl")
    with zipfile.ZipFile(wheel) as unpacked:
        unpacked.extractall(package)
    return package


def replay_cpu(scenario: Path, journal: Path, pythonpath: str | None) -> float:
    """CPU seconds of one `onceflow replay`, with `pythonpath` first on the path if given."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return run_replay(scenario, journal, env)[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="HEAD", help="the revision to compare against")
    parser.add_argument("--runs", type=int, default=10, help="runs of each build")
    parser.add_argument("--documents", type=int, default=300_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        print(f"building {args.base} ...", flush=True)
        package = build_base(args.base, folder)
        scenario = write_scenario(folder / "scenario", generate_lines(args.documents))
        spent: dict[str, list[float]] = {"base": [], "this": []}
        journals = {"base": folder / "base.jsonl", "this": folder / "this.jsonl"}
        for _ in range(args.runs):
            for name in ("base", "this"):
                spent[name].append(replay_cpu(scenario, journals[name],
                                              str(package) if name == "base" else None))
        same = journals["base"].read_bytes() == journals["this"].read_bytes()
    print(f"{args.documents:,} documents, {args.runs} alternating runs each, one core, "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"{'build':<24} {'best CPU s':>10} {'mean CPU s':>10}")
    for name, label in (("base", args.base), ("this", "this working copy")):
        print(f"{label[:24]:<24} {min(spent[name]):>10.3f} "
              f"{statistics.mean(spent[name]):>10.3f}")
    print(f"this / base              {min(spent['this']) / min(spent['base']):>10.3f} "
          f"{statistics.mean(spent['this']) / statistics.mean(spent['base']):>10.3f}")
    print(f"journals identical       {'yes' if same else 'NO'}")
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
