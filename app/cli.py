"""The `onceflow` command."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from onceflow.errors import OnceflowError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="onceflow",
        description="Exactly-once trigger processing on Kafka.",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    replay = commands.add_parser(
        "replay", help="run a scenario folder with no broker, on simulated time",
        description="Run a scenario (triggers.toml, input.jsonl, history.jsonl) and print "
        "the journal, one JSON object per line.",
    )
    replay.add_argument("scenario", help="the scenario folder")
    replay.add_argument("--summary", action="store_true",
                        help="print a table of outcomes per trigger instead of the journal")
    replay.add_argument("--outputs", metavar="DIR",
                        help="also write output, error and in-doubt documents, one file a topic")
    _spark_commands(commands, replay)
    return parser


def _spark_commands(commands: argparse._SubParsersAction,  # type: ignore[type-arg]
                    replay: argparse.ArgumentParser) -> None:
    replay.add_argument("--spark", action="store_true",
                        help="run it through the Spark pipeline (local[2]): the same journal")
    from onceflow.pipeline.cli import add_spark_commands

    add_spark_commands(commands)


def _run_spark_command(args: argparse.Namespace) -> int | None:
    if args.command == "replay" and args.spark:
        from onceflow.pipeline.cli import replay_on_spark

        return replay_on_spark(args.scenario, summary=args.summary, outputs=args.outputs)
    if args.command == "spark":
        from onceflow.pipeline.cli import run_spark_command

        return run_spark_command(args)
    return None


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `onceflow` command."""
    args = _parser().parse_args(argv)
    try:
        code = _run_spark_command(args)
        if code is not None:
            return code
        if args.command == "replay":
            from onceflow.app.replay import run

            return run(args.scenario, summary=args.summary, outputs=args.outputs)
    except OnceflowError as exc:
        print(f"onceflow: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    return 1


def entry() -> None:
    """The console script: run, then leave without tearing down the state objects.

    A replay of millions of records holds millions of small objects; freeing them one by
    one at interpreter exit takes seconds and serves nothing.
    """
    code = main()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:
        pass
    logging.shutdown()
    os._exit(code)


if __name__ == "__main__":
    entry()
