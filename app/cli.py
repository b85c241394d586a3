"""The `onceflow` command."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys

from onceflow.app.boundary import error_boundary
from onceflow.errors import OnceflowError


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("onceflow")
    except PackageNotFoundError:
        return "unknown"


class _Parser(argparse.ArgumentParser):
    """A parser whose epilog may be a function, called only when help is printed."""

    def format_help(self) -> str:
        if callable(self.epilog):
            self.epilog = self.epilog()
        return super().format_help()


class _Version(argparse.Action):
    """--version, reading the installed version only when asked.

    importlib.metadata is slow to import, and every command builds the parser.
    """

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=default,
                         help=help or "show the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        sys.stdout.write(f"onceflow {_version()}\n")
        parser.exit()


def _settings_help() -> str:
    from onceflow.app.settings import settings_help

    return settings_help()


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="onceflow",
        description="Exactly-once trigger processing on Kafka.",
        epilog="Errors are one line on stderr; exit codes: 2 wrong input or setting, 3 "
        "broker or worker unreachable, 4 refused by the system (file, port), 70 unexpected "
        "(ONCEFLOW_DEBUG=1 prints its traceback).",
    )
    parser.add_argument("-V", "--version", action=_Version)
    commands = parser.add_subparsers(dest="command", parser_class=_Parser)

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
    replay.add_argument("--live", action="store_true",
                        help="run it through a real worker on a fresh embedded broker")
    replay.add_argument("--broker", metavar="HOST:PORT",
                        help="with --live: use this broker instead of starting one")
    _worker_commands(commands)
    return parser


def _worker_commands(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from onceflow.app.flags import WORKER_FLAGS

    worker = commands.add_parser(
        "worker", help="run a Faust worker (settings from ONCEFLOW_* variables)",
        description="Run the triggers of a trigger file over Kafka. Settings come from "
        "ONCEFLOW_* variables; the flags below override them.",
        epilog=_settings_help, formatter_class=argparse.RawDescriptionHelpFormatter)
    worker.add_argument("--triggers", required=True, help="the triggers.toml file")
    for flag, (field, metavar) in WORKER_FLAGS.items():
        worker.add_argument(flag, dest=f"set_{field}", metavar=metavar,
                            help=f"sets ONCEFLOW_{field.upper()} (below)")
    check = commands.add_parser(
        "check", help="check a trigger file strictly (exit 1 on any problem)",
        description="Validate a trigger file as a worker does, and strictly: unknown keys, "
        "odd trigger names and [topic.X] tables for topics no trigger reads are problems "
        "too. Every service and resolver is imported. Exit 0 when the file passes, 1 "
        "(each problem on stderr) when not.")
    check.add_argument("triggers", help="the triggers.toml file")
    journal = commands.add_parser(
        "journal", help="print the journal topic (a table, or JSON lines with --json)",
        description="Read the journal topic of the deployment (ONCEFLOW_BROKER_URL, "
        "ONCEFLOW_TOPIC_PREFIX) from its beginning, filtered.")
    journal.add_argument("--trigger", help="only this trigger (- for ingress records, "
                         "which have none)")
    journal.add_argument("--outcome", help="only this outcome (processed, error, in-doubt, ...)")
    journal.add_argument("--since", metavar="WHEN",
                         help="only records from then on: a duration back from now (10m, "
                         "2h, 1d) or an ISO time (2026-11-23T20:00:00Z)")
    journal.add_argument("--follow", "-f", action="store_true",
                         help="keep printing new records until Ctrl-C or SIGTERM")
    journal.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    _broker_flag(journal)
    broker = commands.add_parser(
        "broker", help="run the embedded broker (tansu, in memory) for development")
    broker.add_argument("--port", type=int, default=9092, help="port on 127.0.0.1")
    send = commands.add_parser(
        "send", help="publish records written in the scenario record format (JSON lines)")
    send.add_argument("file", help="a .jsonl file (- for standard input): {ts, topic, "
                      "partition?, key?, headers?, value | raw}")
    send.add_argument("--base-time", type=float, metavar="SECONDS",
                      help="record timestamp = this + ts (default: now)")
    _broker_flag(send)
    for action in ("suspend", "resume"):
        command = commands.add_parser(action, help=f"{action} a trigger on every worker "
                                      "(needs ONCEFLOW_ADMIN_TOKEN)")
        command.add_argument("trigger")
        command.add_argument("--web", help="a worker's web address (default: this machine's)")
    history = commands.add_parser("history", help="show a document's history entry")
    history.add_argument("trigger")
    history.add_argument("identity")
    history.add_argument("--activation", help="for join triggers: the document's activation")
    history.add_argument("--web", help="a worker's web address (default: this machine's)")
    again = commands.add_parser(
        "resubmit", help="decide in-doubt or error documents of a trigger again")
    again.add_argument("trigger")
    again.add_argument("--triggers", required=True, help="the triggers.toml file")
    again.add_argument("--outcome", choices=("in-doubt", "error"), default="in-doubt")
    again.add_argument("--identity", action="append", default=[],
                       help="only this identity (repeat for more)")
    again.add_argument("--dry-run", action="store_true", help="list, do not resubmit")
    _broker_flag(again)
    topics = commands.add_parser(
        "topics", help="print the kafka-topics.sh commands that create every topic a "
        "deployment needs", description="Print one `kafka-topics.sh --create` command for "
        "each topic of the deployment (settings from ONCEFLOW_* variables): partitions, "
        "replication factor and configs as the worker needs them.")
    topics.add_argument("--triggers", required=True, help="the triggers.toml file")
    bridge = commands.add_parser(
        "bridge", help="forward a topic to another topic or cluster, adding a dup-id",
        description="Forward every record of --from to --to (key, value, headers, "
        "timestamp), adding a dup-id derived from its source coordinates when it has none; "
        "source offsets are committed only after the target acknowledged. Each side's "
        "broker and security settings: ONCEFLOW_BRIDGE_SOURCE_* / ONCEFLOW_BRIDGE_TARGET_* "
        "(BROKER_URL, SECURITY_PROTOCOL, SASL_*, SSL_*), else ONCEFLOW_*.")
    bridge.add_argument("--from", dest="source", required=True, metavar="TOPIC",
                        help="the source topic (its full name)")
    bridge.add_argument("--to", dest="target", required=True, metavar="TOPIC",
                        help="the target topic (its full name)")
    bridge.add_argument("--from-broker", metavar="URL", help="the source cluster's "
                        "bootstrap servers (default ONCEFLOW_BRIDGE_SOURCE_BROKER_URL, else "
                        "ONCEFLOW_BROKER_URL)")
    bridge.add_argument("--to-broker", metavar="URL", help="the target cluster's "
                        "bootstrap servers (default ONCEFLOW_BRIDGE_TARGET_BROKER_URL, else "
                        "ONCEFLOW_BROKER_URL)")
    bridge.add_argument("--group", help="consumer group on the source cluster (default "
                        "onceflow-bridge.FROM.TO)")
    bridge.add_argument("--batch-size", type=int, default=1000,
                        help="most records forwarded before each commit (default 1000)")
    bridge.add_argument("--dup-id-prefix", default="bridge:",
                        help="prefix of the dup-ids the bridge adds (default 'bridge:')")
    topics.add_argument("--command-config", metavar="FILE",
                        help="pass --command-config FILE to kafka-topics.sh (a secured "
                        "cluster's client properties)")


def _broker_flag(command: argparse.ArgumentParser) -> None:
    """--broker URL, as `worker` has it (sets ONCEFLOW_BROKER_URL)."""
    command.add_argument("--broker", dest="set_broker_url", metavar="URL",
                         help="Kafka bootstrap servers (sets ONCEFLOW_BROKER_URL)")


def _run_worker_command(args: argparse.Namespace) -> int | None:
    if args.command == "worker":
        from onceflow.app.settings import WorkerSettings
        from onceflow.app.worker import run_worker

        overrides = {name[4:]: value for name, value in vars(args).items()
                     if name.startswith("set_") and value is not None}
        return run_worker(args.triggers, WorkerSettings.from_env(**overrides))
    if args.command == "check":
        from onceflow.app.check import check_file

        return check_file(args.triggers)
    if args.command == "broker":
        from onceflow.app.broker import run_broker

        return run_broker(args.port)
    if args.command == "bridge":
        from onceflow.app.bridge import bridge_spec, run_bridge
        from onceflow.app.settings import WorkerSettings

        return run_bridge(bridge_spec(args, WorkerSettings.from_env()))
    if args.command == "topics":
        from onceflow.app.settings import WorkerSettings
        from onceflow.app.topics import print_topics

        return print_topics(args.triggers, WorkerSettings.from_env(), args.command_config)
    if args.command not in ("send", "suspend", "resume", "history", "resubmit", "journal"):
        return None
    from onceflow.app import ops
    from onceflow.app.settings import WorkerSettings

    broker = getattr(args, "set_broker_url", None)
    settings = WorkerSettings.from_env(**({"broker_url": broker} if broker else {}))
    web = ops.web_address(getattr(args, "web", None) or settings.web_url)
    if args.command == "send":
        return ops.send_file(args.file, settings, args.base_time)
    if args.command == "journal":
        from onceflow.app.journal_reader import show_journal

        return show_journal(settings, trigger=args.trigger, outcome=args.outcome,
                            since=args.since, follow=args.follow, as_json=args.json)
    if args.command in ("suspend", "resume"):
        token = settings.admin_token.get_secret_value() if settings.admin_token else None
        return ops.trigger_command(web, args.trigger, args.command, token)
    if args.command == "history":
        return ops.show_history(web, args.trigger, args.identity, args.activation, settings)
    return ops.resubmit(args.triggers, args.trigger, settings, outcome=args.outcome,
                        identities=args.identity, dry_run=args.dry_run)


def _spark_commands(commands: argparse._SubParsersAction,  # type: ignore[type-arg]
                    replay: argparse.ArgumentParser) -> None:
    replay.add_argument("--spark", action="store_true",
                        help="run it through the Spark pipeline (local[2]): the same journal")
    from onceflow.pipeline.cli import add_spark_commands

    add_spark_commands(commands)


# What the `spark` extra installs; the worker image has none of them.
SPARK_MODULES = frozenset({"pyspark", "py4j", "pandas", "pyarrow", "google"})


def _missing_spark_module() -> str | None:
    """The first module of the `spark` extra that is not installed, if any."""
    for module in ("pyspark", "pyarrow", "pandas"):
        try:
            if importlib.util.find_spec(module) is None:
                return module
        except (ImportError, ValueError):
            return module
    return None


def _spark_extra_missing(module: str) -> OnceflowError:
    return OnceflowError(f"the Spark commands need the `spark` extra ({module} is not "
                         "installed): pip install 'onceflow[spark]'")


def _run_spark_command(args: argparse.Namespace) -> int | None:
    if args.command == "spark" or (args.command == "replay" and args.spark):
        missing = _missing_spark_module()
        if missing is not None:
            raise _spark_extra_missing(missing)
    try:
        if args.command == "replay" and args.spark:
            from onceflow.pipeline.cli import replay_on_spark

            return replay_on_spark(args.scenario, summary=args.summary, outputs=args.outputs)
        if args.command == "spark":
            from onceflow.pipeline.cli import run_spark_command

            return run_spark_command(args)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in SPARK_MODULES:
            raise
        raise _spark_extra_missing(str(exc.name)) from None
    return None


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `onceflow` command: errors are one line and an exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:  # `onceflow` alone: what it can do
        parser.print_help()
        return 2
    return error_boundary(lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    code = _run_spark_command(args)
    if code is not None:
        return code
    if args.command == "replay" and args.live:
        from onceflow.app.live import print_live

        return print_live(args.scenario, summary=args.summary, bootstrap=args.broker)
    if args.command == "replay":
        from onceflow.app.replay import run

        return run(args.scenario, summary=args.summary, outputs=args.outputs)
    code = _run_worker_command(args)
    if code is not None:
        return code
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
