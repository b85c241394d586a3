"""`onceflow check TRIGGERS`: the strict check of a trigger file, before a worker uses it."""

from __future__ import annotations

import sys
from pathlib import Path

from onceflow.errors import ConfigError
from onceflow.runners import load_callees
from onceflow.triggers import load_triggers


def check_file(path: str) -> int:
    """0 when the file passes the strict check, 1 (every problem on stderr) when not.

    2 when there is no such file (as every command says of a missing file).

    Strict: what a worker only warns about is a problem here (unknown keys, odd trigger
    names), and so is a [topic.X] table for a topic no trigger reads.  Every service and
    resolver is imported, as a worker does at start.
    """
    try:
        triggers = load_triggers(Path(path), strict=True)
        load_callees(triggers, base_dir=Path(path).resolve().parent)
    except ConfigError as exc:
        if not Path(path).is_file():  # no file to check: a wrong argument, as elsewhere
            print(f"onceflow: {exc.source}: {exc.where}: {exc.problem}", file=sys.stderr)
            return 2
        for problem in exc.details or (f"{exc.where}: {exc.problem}",):
            print(f"onceflow: {exc.source}: {problem}", file=sys.stderr)
        if len(exc.details) > 1:
            print(f"onceflow: {exc.source}: {len(exc.details)} problems", file=sys.stderr)
        return 1
    names = ", ".join(t.name for t in triggers.triggers)
    topics = ", ".join(triggers.input_topics)
    print(f"onceflow: {path}: ok: {len(triggers.triggers)} trigger(s) ({names}) reading "
          f"{topics}")
    return 0
