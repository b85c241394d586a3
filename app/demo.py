"""`make demo`: the sample documents through a real worker, and what happened to each.

It starts the embedded broker and one worker, sends app/demo/input.jsonl one record at a
time (as `onceflow replay --live` does), prints every journal record and a table of
outcomes read back from the journal topic, shows the web views of the running worker,
then stops what it started.  `python -m onceflow.app.demo --replay` runs the same
documents through `onceflow replay` instead (no broker).
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

from onceflow.app.replay import replay_scenario
from onceflow.journal import summary_table
from onceflow.scenario import load_scenario


def demo_folder() -> Path:
    """The packaged demo scenario."""
    return Path(str(resources.files("onceflow.app") / "demo"))


def print_journal(lines: list[dict[str, Any]]) -> None:
    """One readable line per journal record, then the table of outcomes."""
    for line in lines:
        why = f"  ({line['reason']})" if line.get("reason") else ""
        print(f"  ts={line['ts']!s:>4}  {str(line['trigger'] or '-'):<8} "
              f"{line['outcome']:<15} {line['identity']}{why}")
    print()
    print(summary_table(lines))


def replay_demo() -> int:
    """Run the demo documents through `onceflow replay` and print the journal and a table."""
    folder = demo_folder()
    print(f"== onceflow replay {folder}  (no broker, simulated time)\n")
    journal, _, _ = replay_scenario(load_scenario(folder))
    print_journal([record.as_dict() for record in journal])
    return 0


def live_demo() -> int:
    """Broker, worker, documents, journal, web views; then stop everything."""
    from onceflow.app.broker import EmbeddedBroker
    from onceflow.app.live import LiveRun
    from onceflow.app.process import http_json

    folder = demo_folder()
    workdir = Path(tempfile.mkdtemp(prefix="onceflow-demo-"))
    print("== starting the embedded broker (tansu, in memory, 127.0.0.1)")
    with EmbeddedBroker(log_path=workdir / "broker.log") as broker:
        print(f"   {broker.url}")
        run = LiveRun(load_scenario(folder), broker.bootstrap, workdir)
        print(f"== starting a worker: onceflow worker --triggers {folder / 'triggers.toml'}")
        try:
            lines = asyncio.run(run.run())
            print(f"== {len(lines)} journal records from topic {run.names.journal}\n")
            print_journal(sorted(lines, key=lambda line: line["ts"] if line["ts"] is not None
                                 else float("inf")))
            web = run.worker.web_url
            print(f"== the worker's web views (up while this demo runs) at {web}:")
            for path in ("/triggers", "/history/billing/inv-1", "/joins/fulfil/cart-8",
                         "/metrics", "POST /triggers/{name}/suspend|resume (admin token)"):
                print(f"   {web}{path}" if path.startswith("/") else f"   {path}")
            _, view = http_json(web + "/triggers")
            for name, facts in view["triggers"].items():
                print(f"   /triggers -> {name}: counts {facts['counts']}, "
                      f"open joins {facts['open_joins']}, suspended {facts['suspended']}")
            _, entry = http_json(web + "/history/billing/inv-1")
            print(f"   /history/billing/inv-1 -> {entry['entry']}")
        finally:
            print("== stopping the worker and the broker")
            run.stop()
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


def main() -> int:
    """Entry point of `python -m onceflow.app.demo [--replay]`."""
    if "--replay" in sys.argv[1:]:
        return replay_demo()
    from onceflow.app.process import stopped_on_term

    with stopped_on_term():  # SIGTERM stops the demo's broker and worker too
        return live_demo()


if __name__ == "__main__":
    sys.exit(main())
