"""State keys (onceflow.keys): unambiguous whatever the ids hold (issue 8 item 3)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from onceflow.history import entry_key, history_key
from onceflow.ingress import DeliveryCounter, IdCache
from onceflow.keys import (
    dup_id_key,
    id_next_key,
    id_slot_key,
    key_prefix,
    pair_key,
    partition_scope,
    redelivered_key,
    split_state_key,
    state_key,
)

# Strings rich in the separator and its escape.
PARTS = st.text(alphabet=["a", "\x1e", "\x1f", ":", "é"], max_size=6)


def test_the_colliding_pair_of_the_issue_gets_two_keys() -> None:
    assert history_key("y\x1fz", "x") != history_key("z", "x\x1fy")
    assert history_key("\x1ez", "x") != history_key("z", "x\x1e")


def test_ordinary_ids_keep_the_keys_earlier_versions_stored() -> None:
    assert history_key("u-1", "act") == "act\x1fu-1"
    assert history_key("u-1") == "u-1"
    assert key_prefix("orders") == "orders\x1f"
    assert state_key("held", "orders", "000000000001") == "held\x1forders\x1f000000000001"


def test_an_entry_for_every_activation_never_meets_a_joined_key() -> None:
    assert history_key("x\x1fy") != history_key("y", "x")
    assert entry_key(True, "x\x1fy", None) != entry_key(True, "y", "x")
    assert entry_key(False, "x\x1fy", "a") == "x\x1fy"  # triggers without joins: identity


@given(st.lists(PARTS, min_size=1, max_size=4), st.lists(PARTS, min_size=1, max_size=4))
def test_different_parts_never_give_one_key(a: list[str], b: list[str]) -> None:
    assert split_state_key(state_key(*a)) == a
    assert (state_key(*a) == state_key(*b)) == (a == b)


@given(PARTS, PARTS)
def test_a_pair_key_is_the_state_key_of_the_pair(first: str, second: str) -> None:
    assert pair_key(first, second) == state_key(first, second)
    assert history_key(second, first) == state_key(first, second)
    assert history_key(second) == state_key(second)


@given(PARTS, PARTS, PARTS, PARTS)
def test_prefixed_keys_of_two_stores_never_meet(p1: str, k1: str, p2: str, k2: str) -> None:
    # A shared table holds store p's key k as key_prefix(p) + k.
    assert (key_prefix(p1) + k1 == key_prefix(p2) + k2) == (p1 == p2 and k1 == k2)
    assert split_state_key(key_prefix(p1) + k1, 1) == [p1, k1]


@given(PARTS, PARTS)
def test_history_keys_split_back(identity: str, activation: str) -> None:
    assert split_state_key(history_key(identity, activation)) == [activation, identity]
    assert split_state_key(history_key(identity)) == [identity]


def test_ingress_keys_stay_as_they_are_stored_on_disk() -> None:
    # The worker's ingress table holds these (after key_prefix("ids") or "progress"): a
    # change would forget every cached dup-id and delivery count of a running deployment.
    scope = partition_scope("orders", 3)
    assert scope == "orders/3"
    assert dup_id_key(scope, "d|1#2") == "orders/3|d|1#2"
    assert id_slot_key(scope, 17) == "orders/3#17"
    assert id_next_key(scope) == "orders/3#next"
    assert redelivered_key(scope) == "orders/3#again"


def test_the_duplicate_id_cache_and_delivery_counts_write_exactly_those_keys() -> None:
    ids: dict[str, Any] = {}
    cache = IdCache(ids, partition_scope("t", 0), 2)
    for offset, dup_id in enumerate(["d1", "d2", "d3"]):
        cache.seen(dup_id, f"t/0@{offset}", offset)
    assert ids == {"t/0|d2": [1, "t/0@1", 1], "t/0|d3": [0, "t/0@2", 2],
                   "t/0#0": "d3", "t/0#1": "d2", "t/0#next": 1}
    progress: dict[str, Any] = {}
    counter = DeliveryCounter(progress)
    counter.derive("t", 0, 5)
    counter.derive("t", 0, 5)
    assert progress == {"t/0": 5, "t/0#again": {"5": 1}}
