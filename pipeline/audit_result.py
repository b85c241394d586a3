"""What an audit finds, and the journal facts its queries share.

`AuditResult` and `Violation` are what the checks (audit_checks.py) and the figures
(audit_figures.py) fill in and the report (report.py) reads; `KEY` names the columns that
match journal records to input records, `RAN` and `DUPLICATES` group outcomes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from onceflow import journal as J

KEY = ("k_topic", "k_partition", "k_offset", "k_ts")
RAN = (J.PROCESSED, J.ERROR)
DUPLICATES = (J.DUPLICATE, J.REJECTED, J.DUPLICATE_ID)


@dataclass(slots=True)
class Violation:
    """One broken guarantee, naming the record."""

    check: str
    trigger: str | None
    message: str
    pos: int | None = None


@dataclass(slots=True)
class AuditResult:
    """What the audit found, and the figures the report draws."""

    records: int = 0
    journal_records: int = 0
    violations: list[Violation] = field(default_factory=list)
    violation_count: int = 0
    counts: dict[tuple[str | None, str], int] = field(default_factory=dict)
    in_doubt: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    exempt_pending: int = 0
    exempt_held: int = 0
    timeline: list[dict[str, Any]] = field(default_factory=list)
    join_times: dict[str, list[float]] = field(default_factory=dict)
    duplicate_sources: list[tuple[str, int]] = field(default_factory=list)
    first_ts: float | None = None
    last_ts: float | None = None

    @property
    def passed(self) -> bool:
        """Whether every guarantee held."""
        return self.violation_count == 0
