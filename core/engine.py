"""The replay driver: ingress, then every trigger, record by record, on record time.

`onceflow replay` drives it.  The Spark pipeline runs the trigger part alone
(runners.TriggerRunner) after an ingress stage of its own; the worker drives the same
pieces (Ingress, TriggerProcessor, Partition) asynchronously and in batches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .envelope import Record
from .journal import JournalRecord
from .processor import Sink
from .runners import TriggerRunner
from .scenario import SUSPEND, Control


class Engine(TriggerRunner):
    """Ingress and every trigger over one set of stores, on record time.

    History is not swept on partition time: a record arriving later than the TTL behind
    partition time (a late record, a redelivery after a long lag) is judged on its own
    record time, which a sweep on partition time could not honour.
    """

    def process(self, record: Record, position: int = 0,
                sink: Sink | None = None) -> Sink:
        """Run one record through ingress and every trigger that takes it."""
        if sink is None:
            sink = Sink()
        journal = sink.journal
        self.partition.advance(record.ts, journal)
        document, targets, letter = self.ingress.admit_into(record, position, journal)
        if document is not None:
            processors = self.processors
            for trigger in targets:
                processor = processors[trigger.name]
                run = processor.take(document, sink)
                if run is not None:
                    self._run(processor, document, run, sink)
        elif letter is not None:
            sink.output(letter)
        return sink

    def process_all(self, records: Iterable[Record | Control], sink: Sink,
                    on_journal: Callable[[list[JournalRecord]], None] | None = None,
                    chunk: int = 4096) -> None:
        """Every line in order, positions counted from 0, then the end of the input.

        A Control (an operator's command) is applied between the records around it.

        With `on_journal`, the journal is handed over (and not kept) every `chunk` records
        made and once at the end.  One compiled loop: the replay's per-record glue.
        """
        position = 0
        for record in records:
            if isinstance(record, Control):
                self.command(record, sink)
            else:
                self.process(record, position, sink)
            position += 1
            if on_journal is not None and len(sink.journal) >= chunk:
                on_journal(sink.journal)
                sink.journal = []
        self.end_of_input(sink)
        if on_journal is not None:
            on_journal(sink.journal)
            sink.journal = []

    def command(self, control: Control, sink: Sink) -> None:
        """An operator's suspend or resume at its time (a scenario's control line).

        Time moves to the control's ts first, as a record's would (expiring what is due);
        then the trigger is suspended, or resumed and what it held decided again.
        """
        self.partition.advance(control.ts, sink.journal)
        if control.action == SUSPEND:
            self.suspend(control.trigger, sink=sink)
        else:
            self.resume(control.trigger, sink=sink)
