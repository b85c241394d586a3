"""State keys made of several strings, unambiguous whatever the strings hold.

Every runner builds its state keys here: history keys of join triggers (activation and
identity), the worker's table keys (a trigger's or a cache's prefix before the key of its
own store), and the Spark stage's grouping keys.  Parts are joined with the unit
separator U+001F; inside a part, U+001E escapes itself and U+001F.  So two different
lists of parts never give the same key, one part never gives the key of two, and a part
holding neither character is written as it is: keys of ordinary ids are those of the
plain join, as stored by earlier versions.  Ingress's duplicate-ID caches and delivery
progress keep the older keys they were first stored with (`partition_scope`,
`dup_id_key`, ...), built here too.
"""

from __future__ import annotations

from typing import Final

from mypy_extensions import i64

SEPARATOR: Final = "\x1f"
_ESCAPE: Final = "\x1e"


def key_part(part: str) -> str:
    """One part as it is written inside a key (U+001E and U+001F escaped)."""
    if _ESCAPE in part:
        part = part.replace(_ESCAPE, _ESCAPE + _ESCAPE)
    if SEPARATOR in part:
        part = part.replace(SEPARATOR, _ESCAPE + SEPARATOR)
    return part


def state_key(*parts: str) -> str:
    """The key of a list of parts."""
    return SEPARATOR.join([key_part(part) for part in parts])


def pair_key(first: str, second: str) -> str:
    """state_key(first, second), without the tuple and list a call of state_key makes.

    Made for every document of a join trigger (its history key).
    """
    return key_part(first) + SEPARATOR + key_part(second)


def key_prefix(*parts: str) -> str:
    """A prefix for the keys of one store inside a shared table.

    Any string may follow it: the prefix ends at its last unescaped separator, so the
    prefixes of different lists of parts never start one another's keys.
    """
    return state_key(*parts) + SEPARATOR


def split_state_key(key: str, limit: int = -1) -> list[str]:
    """The parts of a key (inverse of state_key).

    With `limit` >= 0, at most `limit` splits are made and the rest of the key is the last
    part, as it was written (for a key_prefix followed by a store's own key).
    """
    if _ESCAPE not in key:
        return key.split(SEPARATOR, limit)
    parts: list[str] = []
    current: list[str] = []
    i = 0
    n = len(key)
    while i < n:
        char = key[i]
        if char == _ESCAPE and i + 1 < n:
            current.append(key[i + 1])
            i += 2
            continue
        if char == SEPARATOR and (limit < 0 or len(parts) < limit):
            parts.append("".join(current))
            current = []
            i += 1
            if limit >= 0 and len(parts) == limit:
                parts.append(key[i:])
                return parts
            continue
        current.append(char)
        i += 1
    parts.append("".join(current))
    return parts


# -- ingress's keys -------------------------------------------------------------------------
# The duplicate-ID caches and the delivery progress (core/ingress.py) key their entries as
# the first versions stored them, and these keys are on disk: they must not change.  Every
# one starts with a topic partition's scope, "<topic>/<partition>"; a Kafka topic name
# holds only letters, digits, ".", "_" and "-", so the scope ends at its last "/", and what
# follows it ("|" before a dup-id, "#" before the cache's own entries) keeps the kinds apart.


def partition_scope(topic: str, partition: int) -> str:
    """The scope of a topic partition's ingress keys: "<topic>/<partition>".

    Alone, it is the key of the highest offset ingress started on that partition.
    """
    return f"{topic}/{partition}"


def dup_id_key(scope: str, dup_id: str) -> str:
    """The duplicate-ID cache's entry of one dup-id: "<scope>|<dup-id>"."""
    return scope + "|" + dup_id


def id_slot_key(scope: str, slot: int) -> str:
    """The duplicate-ID cache's slot `slot` (the dup-id it holds): "<scope>#<slot>"."""
    return scope + "#" + str(slot)


def id_next_key(scope: str) -> str:
    """The duplicate-ID cache's next slot to write: "<scope>#next"."""
    return scope + "#next"


def redelivered_key(scope: str) -> str:
    """The redelivered offsets of a partition, with their counts: "<scope>#again"."""
    return scope + "#again"


# -- Kafka's default partitioner ------------------------------------------------------------

_MASK32: Final = 0xFFFFFFFF


def _times_m(x: i64) -> i64:
    """(x * 0x5BD1E995) mod 2**32 for x below 2**32, by the constant's two halves.

    Each product stays below 2**48, so the compiled core keeps to machine integers where
    the full product (up to 2**62.5) would spill into arbitrary-precision ones.
    """
    return ((x * 0xE995) + (((x * 0x5BD1) & 0xFFFF) << 16)) & _MASK32


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (the Java client's Utils.murmur2): the same values as aiokafka's."""
    length: i64 = len(data)
    h: i64 = (0x9747B28C ^ length) & _MASK32
    body: i64 = length & ~3
    i: i64 = 0
    k: i64
    while i < body:
        k = _times_m(i64(data[i]) | (i64(data[i + 1]) << 8) | (i64(data[i + 2]) << 16)
                     | (i64(data[i + 3]) << 24))
        k ^= k >> 24
        h = _times_m(h) ^ _times_m(k)
        i += 4
    extra: i64 = length & 3
    if extra:
        if extra >= 3:
            h ^= i64(data[body + 2]) << 16
        if extra >= 2:
            h ^= i64(data[body + 1]) << 8
        h = _times_m(h ^ i64(data[body]))
    h ^= h >> 13
    h = _times_m(h)
    return int(h ^ (h >> 15))


def kafka_partition(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner gives a key (as the Java client does).

    The worker routes every document by its routing key with it, and places produced
    records with a key on the partition Kafka would choose.
    """
    return (murmur2(key) & 0x7FFFFFFF) % partitions
