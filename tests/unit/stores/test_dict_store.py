"""DictStore specifics: exact byte budget and LRU order."""

from __future__ import annotations

from kvmux.stores import DictStore


def _key(i: int) -> bytes:
    return i.to_bytes(16, "big")


def test_lru_evicts_least_recently_used() -> None:
    store = DictStore(300)
    for i in range(3):
        assert store.put(_key(i), bytes([i]) * 100)
    assert store.get(_key(0)) == bytes([0]) * 100  # 0 is now the most recently used
    assert store.put(_key(3), b"d" * 100)
    assert store.contains(_key(0))
    assert not store.contains(_key(1))
    assert store.contains(_key(2))
    assert store.contains(_key(3))
    assert store.used_bytes() == 300
    assert len(store) == 3


def test_recently_read_entries_survive_many_evictions() -> None:
    store = DictStore(10 * 100)
    hot = [_key(i) for i in range(3)]
    for key in hot:
        store.put(key, b"h" * 100)
    for i in range(100, 200):
        for key in hot:
            assert store.get(key) == b"h" * 100
        assert store.put(_key(i), b"c" * 100)
        assert store.used_bytes() <= store.capacity
    assert all(store.contains(key) for key in hot)
    assert len(store) == 10


def test_contains_does_not_refresh_recency() -> None:
    store = DictStore(200)
    store.put(_key(0), b"a" * 100)
    store.put(_key(1), b"b" * 100)
    assert store.contains(_key(0))
    store.put(_key(2), b"c" * 100)
    assert not store.contains(_key(0))
    assert store.contains(_key(1))


def test_re_put_replaces_and_refreshes() -> None:
    store = DictStore(300)
    store.put(_key(0), b"a" * 100)
    store.put(_key(1), b"b" * 100)
    store.put(_key(0), b"A" * 150)
    assert store.get(_key(0)) == b"A" * 150
    assert store.used_bytes() == 250
    store.put(_key(2), b"c" * 100)  # evicts 1, the least recently used
    assert not store.contains(_key(1))
    assert store.get(_key(0)) == b"A" * 150
    assert store.used_bytes() == 250


def test_large_entry_evicts_as_many_as_needed() -> None:
    store = DictStore(300)
    for i in range(3):
        store.put(_key(i), b"x" * 100)
    assert store.put(_key(9), b"y" * 250)
    assert store.used_bytes() == 250
    assert len(store) == 1
    assert store.get(_key(9)) == b"y" * 250


def test_refused_entry_evicts_nothing() -> None:
    store = DictStore(300)
    for i in range(3):
        store.put(_key(i), b"x" * 100)
    assert store.put(_key(9), b"y" * 301) is False
    assert len(store) == 3
    assert store.used_bytes() == 300


def test_delete_and_clear_update_length() -> None:
    store = DictStore(1000)
    for i in range(5):
        store.put(_key(i), b"x")
    store.delete(_key(0))
    assert len(store) == 4
    store.clear()
    assert len(store) == 0
    assert store.used_bytes() == 0
