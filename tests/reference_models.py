"""Plain reference models the tests compare the core against."""

from __future__ import annotations


class ReferenceIdCache:
    """Artemis' circular duplicate-ID cache written as plainly as possible.

    n slots; the (n+1)th id stored overwrites slot 0.  An id that is held is a duplicate
    unless the record carrying it is the one that first carried it (spec section 2: the
    same offset; headers, the delivery count among them, prove nothing).  A dropped id is
    not stored again.
    """

    def __init__(self, size: int) -> None:
        self.slots: list[str | None] = [None] * size
        self.next = 0
        self.first: dict[str, tuple[str, int]] = {}

    def seen(self, dup_id: str, message_id: str, offset: int, delivery_count: int) -> bool:
        if dup_id in self.first:
            first_message_id, first_offset = self.first[dup_id]
            return offset != first_offset
        evicted = self.slots[self.next]
        if evicted is not None:
            del self.first[evicted]
        self.slots[self.next] = dup_id
        self.first[dup_id] = (message_id, offset)
        self.next = (self.next + 1) % len(self.slots)
        return False

    def ids(self) -> list[str]:
        n = len(self.slots)
        ordered = [self.slots[(self.next + i) % n] for i in range(n)]
        return [i for i in ordered if i is not None]
