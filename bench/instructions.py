"""Benchmark: instructions a document of the worker's path and of the replay, two builds.

On this 2-core machine shared with other work, CPU time moves by a quarter between runs
minutes apart, so a change of a few percent in the worker's own code cannot be seen in
`bench/partition.py`'s timings.  Instructions executed can: this runs
`bench/partition.py --only ...` under valgrind's callgrind (which counts every instruction
the process executes, whatever else runs on the machine) for this working copy and for
another revision's build (made as bench/compare.py makes it), and prints, for each build,
the instructions a document of:

- the worker's per-partition path (`Runtime.handle` with memory tables, every record
  encoded into an aiokafka record batch: bench/partition.py says what it does);
- the replay engine (the core alone), the baseline the worker path is compared with;

each the count of a run with that runner minus the count of a run that only makes the
records (`--only none`), divided by the documents.  Then the working copy's counts against
the other build's.  Instructions are not time (a cache miss costs more than an add), so
timings stay the measure of speed; this shows which way a change moves the code's own
work, and by how much, on any machine.  Counts repeat within a few tenths of a percent
(2026-11-27: 5,923 and 5,909 million for one whole bench/partition.py run).

    .venv/bin/python bench/instructions.py [--base HEAD] [--documents 20000]

Needs valgrind (Debian: `apt install valgrind`); a run of 20,000 documents takes about a
minute under callgrind.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import build_base  # noqa: E402

HERE = Path(__file__).resolve().parent


def instructions(runner: str, documents: int, pythonpath: str | None, folder: Path) -> int:
    """Instructions callgrind counted in one `bench/partition.py --only runner`."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env["PYTHONHASHSEED"] = "0"  # the same dict and set layouts in every run
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    out = folder / "callgrind.out"
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
         sys.executable, str(HERE / "partition.py"), "--only", runner,
         "--documents", str(documents)],
        capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"partition.py --only {runner} failed:\n{done.stderr[-3000:]}")
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise SystemExit(f"no count in callgrind's output:\n{done.stderr[-3000:]}")
    out.unlink(missing_ok=True)
    return int(found.group(1))


def per_document(documents: int, pythonpath: str | None, folder: Path) -> dict[str, float]:
    """Instructions a document of each runner, the records' making taken off."""
    setup = instructions("none", documents, pythonpath, folder)
    return {runner: (instructions(runner, documents, pythonpath, folder) - setup) / documents
            for runner in ("replay", "worker")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="HEAD", help="the revision to compare against")
    parser.add_argument("--documents", type=int, default=20_000)
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("bench/instructions.py needs valgrind (apt install valgrind)")
    with tempfile.TemporaryDirectory(prefix="onceflow-instructions-") as scratch:
        folder = Path(scratch)
        base = build_base(args.base, folder)
        counts = {"this working copy": per_document(args.documents, None, folder),
                  args.base: per_document(args.documents, str(base), folder)}
    print(f"{args.documents:,} documents (bench/partition.py's job), instructions a "
          f"document under callgrind")
    print(f"{'build':<20} {'replay':>10} {'worker path':>12} {'worker/replay':>14}")
    for name, found in counts.items():
        print(f"{name:<20} {found['replay']:>10,.0f} {found['worker']:>12,.0f} "
              f"{found['worker'] / found['replay']:>13.2f}x")
    ours, theirs = counts["this working copy"], counts[args.base]
    print(f"this working copy / {args.base}: replay {ours['replay'] / theirs['replay']:.3f}x, "
          f"worker path {ours['worker'] / theirs['worker']:.3f}x")


if __name__ == "__main__":
    main()
