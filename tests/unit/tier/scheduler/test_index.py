"""kvmux.tier.scheduler.index: the scheduler's views of a tier."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from kvmux.codec import SigningKeys
from kvmux.errors import StoreError
from kvmux.keys import BlockKey, store_key
from kvmux.metrics import TierStats
from kvmux.stores import DictStore
from kvmux.tier.scheduler.generation import decode_generation, decode_record, encode_record
from kvmux.tier.scheduler.index import (
    LostKeys,
    MirrorIndex,
    RecentSaves,
    RemoteStoreView,
    SharedStoreView,
)

FOUR = bytes([4]) * 16


def _k(i: int) -> bytes:
    return i.to_bytes(16, "big")


def test_max_entries() -> None:
    assert MirrorIndex(capacity=1000, entry_size=100).max_entries == 10
    assert MirrorIndex(capacity=1099, entry_size=100).max_entries == 10
    assert MirrorIndex(capacity=99, entry_size=100).max_entries == 0


def test_empty_index() -> None:
    index = MirrorIndex(1000, 100)
    assert len(index) == 0
    assert index.count_prefix([]) == 0
    assert index.count_prefix([_k(1)]) == 0
    assert not index.contains(_k(1))


def test_record_saved_then_count_prefix() -> None:
    index = MirrorIndex(1000, 100)
    assert index.record_saved([_k(0), _k(1), _k(2), _k(4)]) == []
    assert len(index) == 4
    keys = [_k(i) for i in range(6)]
    assert index.count_prefix(keys) == 3
    assert index.count_prefix(keys[1:]) == 2
    assert index.count_prefix(keys[3:]) == 0
    assert index.count_prefix(keys[4:]) == 1
    assert index.contains(_k(4))
    assert not index.contains(_k(3))


def test_record_saved_accepts_any_iterable() -> None:
    index = MirrorIndex(1000, 100)
    index.record_saved(k for k in [_k(1), _k(2)])
    assert index.count_prefix([_k(1), _k(2)]) == 2


def test_eviction_is_least_recently_saved_first() -> None:
    index = MirrorIndex(300, 100)
    assert index.record_saved([_k(0), _k(1), _k(2)]) == []
    assert index.record_saved([_k(3)]) == [_k(0)]
    assert index.record_saved([_k(4), _k(5)]) == [_k(1), _k(2)]
    assert len(index) == 3
    assert [index.contains(_k(i)) for i in range(6)] == [False] * 3 + [True] * 3


def test_count_prefix_hits_become_most_recently_used() -> None:
    index = MirrorIndex(300, 100)
    index.record_saved([_k(0), _k(1), _k(2)])
    assert index.count_prefix([_k(0)]) == 1
    assert index.record_saved([_k(3)]) == [_k(1)]
    assert index.record_saved([_k(4)]) == [_k(2)]
    assert index.record_saved([_k(5)]) == [_k(0)]


def test_count_prefix_stops_at_the_first_gap_without_touching_later_keys() -> None:
    index = MirrorIndex(300, 100)
    index.record_saved([_k(0), _k(1), _k(2)])
    # _k(9) is absent: _k(0) is touched, _k(1) is not
    assert index.count_prefix([_k(0), _k(9), _k(1)]) == 1
    assert index.record_saved([_k(3)]) == [_k(1)]


def test_contains_does_not_refresh() -> None:
    index = MirrorIndex(200, 100)
    index.record_saved([_k(0), _k(1)])
    assert index.contains(_k(0))
    assert index.record_saved([_k(2)]) == [_k(0)]


def test_re_saving_a_key_refreshes_it_without_growing() -> None:
    index = MirrorIndex(300, 100)
    index.record_saved([_k(0), _k(1), _k(2)])
    assert index.record_saved([_k(0)]) == []
    assert len(index) == 3
    assert index.record_saved([_k(3)]) == [_k(1)]


def test_forget() -> None:
    index = MirrorIndex(300, 100)
    index.record_saved([_k(0), _k(1), _k(2)])
    index.forget([_k(1), _k(7)])  # unknown keys are ignored
    assert len(index) == 2
    assert not index.contains(_k(1))
    assert index.count_prefix([_k(0), _k(1), _k(2)]) == 1
    assert index.record_saved([_k(3)]) == []  # room was freed


def test_index_never_exceeds_max_entries() -> None:
    index = MirrorIndex(500, 100)
    evicted: list[bytes] = []
    for i in range(50):
        evicted += index.record_saved([_k(i), _k(i + 1000)])
        assert len(index) <= index.max_entries == 5
    assert len(evicted) == 100 - 5
    assert len(set(evicted)) == len(evicted)


def test_zero_budget_admits_nothing() -> None:
    index = MirrorIndex(50, 100)
    assert index.record_saved([_k(0), _k(1)]) == []
    assert len(index) == 0
    assert index.count_prefix([_k(0)]) == 0


# -- SharedStoreView -----------------------------------------------------------


def test_shared_view_asks_the_store_for_rank_zero_shards() -> None:
    store = DictStore(1 << 20)
    stats = TierStats()
    view = SharedStoreView(store, stats)
    keys = [BlockKey(_k(i)) for i in range(4)]
    for key in keys[:2]:
        store.put(store_key(key, 0), b"entry")
    store.put(store_key(keys[2], 1), b"only rank 1")
    assert view.count_prefix(keys) == 2
    assert view.contains(keys[1])
    assert not view.contains(keys[2])
    assert stats.store_errors == 0


def test_saves_still_being_written_count_as_held_until_forgotten() -> None:
    store = DictStore(1 << 20)
    view = SharedStoreView(store, TierStats())
    keys = [BlockKey(_k(i)) for i in range(4)]
    store.put(store_key(keys[0], 0), b"entry")
    assert view.record_saved(keys[1:3]) == []  # the store evicts by itself
    assert view.count_prefix(keys) == 3  # one written, two in the writer's queue
    assert view.contains(keys[2])
    view.forget([keys[2]])  # its save was dropped
    assert view.count_prefix(keys) == 2
    assert view.reset()
    assert view.count_prefix(keys[1:]) == 0


def test_recent_saves_expire_and_stay_bounded() -> None:
    recent = RecentSaves(ttl=0.0, max_keys=2)
    keys = [BlockKey(_k(i)) for i in range(3)]
    recent.add(keys)
    assert recent.count_prefix(keys) == 0  # expired at once: the store answers alone
    recent = RecentSaves(ttl=60.0, max_keys=2)
    recent.add(keys)
    assert recent.count_prefix(keys[1:]) == 2
    assert recent.count_prefix(keys) == 0  # the oldest went past the bound


def test_a_key_that_failed_to_load_is_absent_until_saved_again() -> None:
    """The store still holds a forged or corrupt entry: it is not offered again, and
    the next save of its block is planned (and written over it)."""
    store = DictStore(1 << 20)
    view = SharedStoreView(store, TierStats())
    keys = [BlockKey(_k(i)) for i in range(4)]
    for key in keys:
        store.put(store_key(key, 0), b"entry")
    view.forget([keys[2]])  # its entry did not load
    assert view.count_prefix(keys) == 2
    assert not view.contains(keys[2])
    assert view.contains(keys[3])
    view.record_saved([keys[2]])
    assert view.count_prefix(keys) == 4
    view.forget([keys[0]])
    assert view.reset()  # a new generation: nothing of the old one is lost
    assert view.count_prefix(keys) == 4


def test_lost_keys_stay_bounded() -> None:
    lost = LostKeys(max_keys=2)
    keys = [BlockKey(_k(i)) for i in range(3)]
    lost.add(keys)
    assert lost.usable(keys) == 1  # the oldest went past the bound
    lost.discard(keys[1:2])
    assert lost.usable(keys) == 2


class _FailingStore(DictStore):
    def contains(self, key: bytes) -> bool:
        raise StoreError("disk on fire")

    def count_prefix(self, keys: Sequence[bytes]) -> int:
        raise StoreError("disk on fire")


def test_shared_view_treats_store_errors_as_misses() -> None:
    stats = TierStats()
    view = SharedStoreView(_FailingStore(1000, name="broken"), stats)
    assert view.count_prefix([_k(1), _k(2)]) == 0
    assert not view.contains(_k(1))
    assert stats.store_errors == 2


def test_a_reset_by_one_engine_applies_to_every_engine_on_a_shared_tier(tmp_path) -> None:
    from kvmux.stores import DiskStore

    one = SharedStoreView(DiskStore(tmp_path / "kv", 1 << 20), TierStats())
    other = SharedStoreView(DiskStore(tmp_path / "kv", 1 << 20), TierStats())
    first = one.generation()
    assert first is not None and other.generation() == first  # the second follows the first
    assert one.reset()
    assert one.generation() == other.generation() != first


class FlakyGenerations(DictStore):
    """A store whose generation reads fail while ``down``."""

    down = False

    def read_generation(self) -> bytes | None:
        if self.down:
            raise StoreError("server down")
        return super().read_generation()


def test_a_remote_view_reads_the_generation_at_start_and_keeps_it_through_failures() -> None:
    store = FlakyGenerations(1 << 20)
    store.write_generation(encode_record(FOUR, None))
    view = RemoteStoreView(store, TierStats(), wait_seconds=0.01)
    try:
        assert view.generation() == FOUR  # known from the first request on
        stats = TierStats()
        store.down = True
        shared = SharedStoreView(store, stats)
        assert shared.generation() is None  # never read: unknown
        store.down = False
        assert shared.generation() == FOUR
        store.down = True
        assert shared.generation() == FOUR  # a failed read keeps the last one, counted
        assert stats.store_errors == 2
    finally:
        view.close()


def test_a_generation_record_nobody_signed_is_replaced_never_followed() -> None:
    store, signing = DictStore(1 << 20), SigningKeys("k1", {"k1": b"s" * 32})
    view = SharedStoreView(store, TierStats(), signing)
    mine = view.generation()
    assert mine is not None and decode_record(store.read_generation(), signing) == mine
    for hostile in (b"0", str(2**64).encode(), b"9" * 20, b"1" * 32, encode_record(FOUR, None)):
        store.write_generation(hostile)
        moved = view.generation()
        assert moved not in (None, mine, FOUR)  # a new generation: misses, never old entries
        assert decode_record(store.read_generation(), signing) == moved  # written back
        mine = moved


def test_an_engine_never_returns_to_a_generation_it_left() -> None:
    store = DictStore(1 << 20)
    view = SharedStoreView(store, TierStats())
    old = view.generation()
    before = store.read_generation()
    assert view.reset()
    now = view.generation()
    assert before is not None
    store.write_generation(before)  # the old record put back (a replay, or a slow engine)
    assert view.generation() == now != old
    assert decode_record(store.read_generation(), None) == now  # the current one restored


class SlowGenerations(DictStore):
    """A store whose generation reads wait for ``gate`` once it is set up."""

    gate: threading.Event | None = None

    def read_generation(self) -> bytes | None:
        value = super().read_generation()
        if self.gate is not None:
            self.gate.wait(5)
        return value


def test_a_generation_read_that_began_before_a_reset_changes_nothing() -> None:
    store = SlowGenerations(1 << 20)
    view = RemoteStoreView(store, TierStats(), wait_seconds=0.01)
    try:
        old = view.generation()
        store.gate = threading.Event()
        view._refreshed_at = 0.0  # due now
        view.generation()  # starts a background read of the old record
        assert view.reset()
        reset_to = view.generation()
        assert reset_to != old
        store.gate.set()  # the old read lands after the reset
        assert view._refresh is not None
        view._refresh.result(5)
        assert view.generation() == reset_to
        assert decode_record(store.read_generation(), None) == reset_to
    finally:
        view.close()


def test_saves_in_flight_are_not_offered_while_the_store_is_down() -> None:
    store = _FailingStore(1 << 20, name="down")
    view = SharedStoreView(store, TierStats())
    keys = [BlockKey(_k(i)) for i in range(2)]
    view.record_saved(keys)
    assert view.count_prefix(keys) == 0  # the load could not reach them either


class SlowRecordWrites(DictStore):
    """A store whose generation writes from a lookup thread wait for ``gate``."""

    def __init__(self) -> None:
        super().__init__(1 << 20, name="slow")
        self.gate = threading.Event()
        self.writing = threading.Event()

    def write_generation(self, record: bytes) -> None:
        if threading.current_thread().name.startswith("kvmux-slow-lookup"):
            self.writing.set()
            self.gate.wait(5)
        super().write_generation(record)


def test_a_write_back_in_flight_never_lands_over_a_reset() -> None:
    store = SlowRecordWrites()
    view = RemoteStoreView(store, TierStats(), wait_seconds=0.01)
    try:
        view.generation()
        store.write_generation(b"garbage")  # the refresh will write a new record back
        view._refreshed_at -= 10
        view.generation()
        assert store.writing.wait(5)
        threading.Timer(0.2, store.gate.set).start()  # the slow write ends during the reset
        assert view.reset()
        after = view.generation()
        assert view._refresh is not None
        view._refresh.result(5)
        assert decode_record(store.read_generation(), None) == after == view.generation()
    finally:
        view.close()


def test_engines_converge_and_never_go_back() -> None:
    store = DictStore(1 << 20)
    one, other = SharedStoreView(store, TierStats()), SharedStoreView(store, TierStats())
    first = one.generation()
    assert other.generation() == first
    stale = store.read_generation()
    assert other.reset()
    moved = one.generation()
    assert moved != first and other.generation() == moved
    for _ in range(5000):  # a writer floods the record: each read moves forward
        store.write_generation(b"garbage")
        one.generation()
    store.write_generation(stale)  # then replays the record from before the reset
    assert one.generation() not in (None, first)
    assert decode_record(store.read_generation(), None) == one.generation()
    assert other.generation() == one.generation()  # the other follows the greater one


def test_a_reset_moves_past_what_the_tier_holds() -> None:
    store = DictStore(1 << 20)
    behind, ahead = SharedStoreView(store, TierStats()), SharedStoreView(store, TierStats())
    behind.generation()
    for _ in range(3):
        ahead.reset()  # three resets the other engine has not read yet
    assert behind.reset()
    assert ahead.generation() == behind.generation()  # its reset reached the other


def test_decode_refuses_what_no_engine_writes() -> None:
    good = encode_record(FOUR, None, 7)
    assert decode_generation(good, None) == (7, FOUR)
    for bad in (
        encode_record(bytes(16), None),  # the all-zero id
        good.replace(b" 7 ", b" 07 "),
        good.replace(b" 7 ", b" -7 "),
        good.replace(b" 7 ", b" " + str(2**64).encode() + b" "),
        good + b"x",
        good.replace(b"v2", b"v1"),
        None,
        7,
        [good],
    ):
        assert decode_generation(bad, None) is None
