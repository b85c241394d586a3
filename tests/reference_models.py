"""Plain reference models the tests compare the core against."""

from __future__ import annotations


class ReferenceIdCache:
    """Artemis' circular duplicate-ID cache written as plainly as possible.

    n slots; the (n+1)th id stored overwrites slot 0.  An id that is held is a duplicate
    unless the record carrying it is the one that first carried it (design 1).  A dropped
    id is not stored again.
    """

    def __init__(self, size: int) -> None:
        self.slots: list[str | None] = [None] * size
        self.next = 0
        self.first: dict[str, str] = {}

    def seen(self, dup_id: str, message_id: str) -> bool:
        if dup_id in self.first:
            return self.first[dup_id] != message_id
        evicted = self.slots[self.next]
        if evicted is not None:
            del self.first[evicted]
        self.slots[self.next] = dup_id
        self.first[dup_id] = message_id
        self.next = (self.next + 1) % len(self.slots)
        return False

    def ids(self) -> list[str]:
        n = len(self.slots)
        ordered = [self.slots[(self.next + i) % n] for i in range(n)]
        return [i for i in ordered if i is not None]
