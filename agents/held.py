"""Documents held for suspended triggers, in a partition's control table.

They survive a restart: the suspension and the held documents are changelogged with the
partition's other state.
"""

from __future__ import annotations

import orjson
from onceflow.envelope import Document
from onceflow.keys import key_prefix, split_state_key, state_key
from onceflow.tables.state import PartitionStore

from . import limits

_SUSPENDED = "suspended"
_HELD = "held"
_HELD_PREFIX = key_prefix(_HELD)


class HeldInControl:
    """Held documents in the partition's control table: they survive a restart.

    Each under `held<US>trigger<US>NNNNNNNNNNNN`, numbered in arrival order; the
    suspension itself under `suspended<US>trigger`.  A document whose changelog record
    would be larger than max_record_bytes is refused (bad input for the trigger).
    """

    def __init__(self, control: PartitionStore, triggers: list[str], limit: int) -> None:
        self.control = control
        self.limit = limit
        self.keys: dict[str, list[str]] = {name: [] for name in triggers}
        for key in control.keys():
            if key.startswith(_HELD_PREFIX):
                _, name, _ = split_state_key(key)
                if name in self.keys:
                    self.keys[name].append(key)

    def add(self, trigger: str, doc: Document) -> str | None:
        """Keep doc in the control table; why not, when its record would be too large."""
        keys = self.keys[trigger]
        last = int(split_state_key(keys[-1])[-1]) if keys else 0
        key = state_key(_HELD, trigger, f"{last + 1:012d}")
        data = doc.to_json()
        size = limits.record_size(key.encode(), orjson.dumps(data))
        if size > self.limit:
            return limits.too_large("the document held for the suspended trigger", size,
                                    self.limit)
        self.control[key] = data
        keys.append(key)
        return None

    def drain(self, trigger: str) -> list[Document]:
        """The held documents, oldest first, removed from the table."""
        keys, self.keys[trigger] = self.keys[trigger], []
        docs = []
        for key in keys:
            docs.append(Document.from_json(self.control[key]))
            del self.control[key]
        return docs

    def suspensions(self) -> dict[str, str]:
        """The recorded suspensions of the triggers: {trigger: reason}."""
        found = {}
        for name in self.keys:
            entry = self.control.get(state_key(_SUSPENDED, name))
            if entry is not None:
                found[name] = entry["reason"]
        return found

    def mark(self, trigger: str, reason: str | None) -> None:
        """Record (or clear, reason None) the suspension of trigger."""
        key = state_key(_SUSPENDED, trigger)
        if reason is not None:
            self.control[key] = {"reason": reason}
        elif key in self.control:
            del self.control[key]
