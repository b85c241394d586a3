"""`make demo`: the sample documents through onceflow, and what happened to each."""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path

from onceflow.app.replay import replay_scenario, summary_table
from onceflow.scenario import load_scenario


def demo_folder() -> Path:
    """The packaged demo scenario."""
    return Path(str(resources.files("onceflow.app") / "demo"))


def replay_demo() -> int:
    """Run the demo documents through `onceflow replay` and print the journal and a table."""
    folder = demo_folder()
    print(f"== onceflow replay {folder}  (no broker, simulated time)\n")
    journal, _, _ = replay_scenario(load_scenario(folder))
    for record in journal:
        line = record.as_dict()
        why = f"  ({line['reason']})" if line.get("reason") else ""
        print(f"  ts={line['ts']!s:>4}  {str(line['trigger'] or '-'):<8} "
              f"{line['outcome']:<15} {line['identity']}{why}")
    print()
    print(summary_table(r.as_dict() for r in journal))
    return 0


def main() -> int:
    """Entry point of `python -m onceflow.app.demo`."""
    return replay_demo()


if __name__ == "__main__":
    sys.exit(main())
