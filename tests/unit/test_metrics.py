"""kvmux.metrics and the kvmux.errors tree."""

from __future__ import annotations

import threading

from kvmux.errors import ConfigError, CorruptEntry, KvmuxError, StoreError, StoreUnavailable
from kvmux.metrics import GAUGES, TierStats


def test_add_and_snapshot() -> None:
    stats = TierStats()
    stats.add(lookups=1, hit_tokens=32)
    stats.add(lookups=2, load_seconds=0.5)
    snapshot = stats.snapshot()
    assert snapshot["lookups"] == 3
    assert snapshot["hit_tokens"] == 32
    assert snapshot["load_seconds"] == 0.5
    assert "_lock" not in snapshot
    assert set(snapshot) >= {"saved_blocks", "load_errors", "bytes_saved", "store_errors"}


def test_concurrent_adds_are_not_lost() -> None:
    stats = TierStats()

    def work() -> None:
        for _ in range(2000):
            stats.add(saved_blocks=1, bytes_saved=10)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert stats.saved_blocks == 16000
    assert stats.bytes_saved == 160000


def test_counters_belong_to_their_instance() -> None:
    one, other = TierStats(), TierStats()
    one.add(lookups=5)
    assert other.snapshot()["lookups"] == 0
    assert one.snapshot()["lookups"] == 5


def test_observe_stored_keeps_the_peak() -> None:
    stats = TierStats()
    stats.observe_stored(300)
    stats.observe_stored(100)
    snapshot = stats.snapshot()
    assert (snapshot["stored_bytes"], snapshot["peak_stored_bytes"]) == (100, 300)
    assert {"stored_bytes", "peak_stored_bytes", "peak_save_queue_bytes"} == GAUGES


def test_error_tree() -> None:
    assert issubclass(ConfigError, KvmuxError)
    assert issubclass(ConfigError, ValueError)
    assert issubclass(StoreError, KvmuxError)
    assert issubclass(StoreUnavailable, StoreError)
    assert issubclass(CorruptEntry, KvmuxError)
    assert not issubclass(CorruptEntry, StoreError)
    error = ConfigError("store.type", "unknown store type 'x'", {"memory", "disk"})
    assert (error.key, error.problem, error.accepted) == (
        "store.type",
        "unknown store type 'x'",
        "disk, memory",
    )
