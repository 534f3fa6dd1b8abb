"""TierScheduler.take_saved: what the plans save, per request and position (for KV events)."""

from __future__ import annotations

import random
from collections.abc import Sequence

from kvmux.keys import BlockKey, block_keys, group_key, namespace_id
from kvmux.metrics import TierStats
from kvmux.tier.scheduler.index import MirrorIndex
from kvmux.tier.scheduler.plan import SavedBlock
from kvmux.tier.scheduler.scheduler import ScheduledRequest, TierScheduler

NS = namespace_id({"m": "x"})
BS = 16
ENTRY = 1000


def _prompt(length: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 50_000) for _ in range(length)]


def _keys(prompt: Sequence[int]) -> list[BlockKey]:
    return block_keys(NS, prompt, BS, None)


def _scheduler(
    entries: int = 1000, record: bool = True, groups: int = 1
) -> tuple[TierScheduler, MirrorIndex]:
    view = MirrorIndex(entries * ENTRY, ENTRY)
    windows = (None,) * groups
    return TierScheduler(view, BS, NS, TierStats(), windows, record_saves=record), view


def _prefill(scheduler: TierScheduler, req_id: str, prompt: Sequence[int], groups: int = 1) -> None:
    """Look the request up, then compute its whole prompt in one step."""
    hit = scheduler.lookup(req_id, prompt, None, 0)
    assert hit == 0
    blocks = [list(range(1 + 100 * g, 1 + 100 * g + len(prompt) // BS + 1)) for g in range(groups)]
    scheduler.on_alloc(req_id, blocks, 0)
    scheduler.build([ScheduledRequest(req_id, 0, len(prompt), blocks)])


def test_each_saved_block_comes_with_its_request_and_position() -> None:
    scheduler, _ = _scheduler()
    prompt = _prompt(3 * BS + 5)
    _prefill(scheduler, "a", prompt)
    keys = _keys(prompt)
    assert scheduler.take_saved() == [SavedBlock("a", i, 0, keys[i]) for i in range(3)]
    assert scheduler.take_saved() == []  # taken once


def test_a_block_two_requests_save_in_one_step_is_the_first_ones() -> None:
    scheduler, _ = _scheduler()
    prompt = _prompt(2 * BS + 1)
    for req_id in ("a", "b"):
        assert scheduler.lookup(req_id, prompt, None, 0) == 0
        scheduler.on_alloc(req_id, ([1, 2, 3],), 0)
    scheduler.build(
        [
            ScheduledRequest(r, 0, len(prompt), ([1, 2, 3],) if r == "a" else ([4, 5, 6],))
            for r in "ab"
        ]
    )
    assert [(s.req_id, s.position) for s in scheduler.take_saved()] == [("a", 0), ("a", 1)]


def test_a_save_the_tier_drops_at_once_is_not_recorded() -> None:
    scheduler, view = _scheduler(entries=2)
    prompt = _prompt(4 * BS + 1)
    _prefill(scheduler, "a", prompt)
    assert [s.position for s in scheduler.take_saved()] == [2, 3]  # 0 and 1 were evicted
    assert len(view) == 2


def test_every_groups_share_is_recorded_with_its_group() -> None:
    scheduler, _ = _scheduler(groups=2)
    prompt = _prompt(BS + 1)
    _prefill(scheduler, "a", prompt, groups=2)
    key = _keys(prompt)[0]
    assert scheduler.take_saved() == [
        SavedBlock("a", 0, 0, group_key(key, 0)),
        SavedBlock("a", 0, 1, group_key(key, 1)),
    ]


def test_nothing_is_recorded_unless_asked() -> None:
    scheduler, _ = _scheduler(record=False)
    _prefill(scheduler, "a", _prompt(3 * BS + 1))
    assert scheduler.take_saved() == []
