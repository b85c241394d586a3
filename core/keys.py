"""State keys made of several strings, unambiguous whatever the strings hold.

Every runner builds its state keys here: history keys of join triggers (activation and
identity), the worker's table keys (a trigger's or a cache's prefix before the key of its
own store), and the Spark stage's grouping keys.  Parts are joined with the unit
separator U+001F; inside a part, U+001E escapes itself and U+001F.  So two different
lists of parts never give the same key, one part never gives the key of two, and a part
holding neither character is written as it is: keys of ordinary ids are those of the
plain join, as stored by earlier versions.
"""

from __future__ import annotations

SEPARATOR = "\x1f"
_ESCAPE = "\x1e"


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
