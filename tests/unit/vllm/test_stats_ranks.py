"""Counters of a tier over the ranks of a TP engine: blocks once, bytes and failures summed."""

from __future__ import annotations

from kvmux.metrics import TierStats
from kvmux.vllm.stats import StoreConnectorStats


def test_blocks_are_counted_by_the_first_rank_and_bytes_by_every_rank() -> None:
    ranks = [TierStats(), TierStats()]
    ranks[1].count_blocks(False)
    for stats in ranks:  # each rank loads and saves its shards of the same 3 blocks
        stats.add(loaded_blocks=3, bytes_loaded=300, saved_blocks=3, bytes_saved=300)
    ranks[1].add(dropped_saves=1, save_errors=1)  # this rank's own failures
    merged = StoreConnectorStats(data=dict(ranks[0].snapshot()))
    merged.aggregate(StoreConnectorStats(data=dict(ranks[1].snapshot())))
    flat = merged.reduce()
    assert (flat["loaded_blocks"], flat["saved_blocks"]) == (3, 3)
    assert (flat["bytes_loaded"], flat["bytes_saved"]) == (600, 600)
    assert (flat["dropped_saves"], flat["save_errors"]) == (1, 1)
