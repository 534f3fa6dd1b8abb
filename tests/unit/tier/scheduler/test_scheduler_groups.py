"""kvmux.tier.scheduler.scheduler with several KV cache groups: keys, windows, hit points, plans."""

from __future__ import annotations

import random
from collections.abc import Sequence

from kvmux.keys import BlockKey, block_keys, group_key, namespace_id
from kvmux.metrics import TierStats
from kvmux.tier.scheduler.index import MirrorIndex, TierView
from kvmux.tier.scheduler.scheduler import NULL_BLOCK, ScheduledRequest, TierScheduler

NS = namespace_id({"m": "hybrid"})
BS = 16
ENTRY = 1000
HYBRID = (None, 2 * BS)  # a full-attention group and a sliding window of two blocks


def _prompt(length: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 50_000) for _ in range(length)]


def _keys(prompt: Sequence[int], group: int) -> list[BlockKey]:
    return [group_key(k, group) for k in block_keys(NS, prompt, BS)]


def _scheduler(
    windows: Sequence[int | None] = HYBRID, view: TierView | None = None
) -> tuple[TierScheduler, MirrorIndex]:
    index = MirrorIndex(1000 * ENTRY, ENTRY)
    view = view if view is not None else index
    return TierScheduler(view, BS, NS, TierStats(), windows), index


def _hold(index: MirrorIndex, prompt: Sequence[int], group: int, blocks: Sequence[int]) -> None:
    keys = _keys(prompt, group)
    index.record_saved([keys[i] for i in blocks])


# -- keys --------------------------------------------------------------------------------


def test_group_zero_keeps_the_block_keys_and_other_groups_have_their_own() -> None:
    scheduler, index = _scheduler()
    prompt = _prompt(3 * BS)
    scheduler.lookup("r", prompt, None, 0)
    plan = scheduler.build([ScheduledRequest("r", 0, 3 * BS, ([1, 2, 3], [4, 5, 6]))])
    full = [t.key for t in plan.saves if t.group == 0]
    window = [t.key for t in plan.saves if t.group == 1]
    assert full == block_keys(NS, prompt, BS)
    assert window == _keys(prompt, 1)
    assert set(full).isdisjoint(window)
    assert len(index) == 6


# -- hit points ----------------------------------------------------------------------------


def test_a_sliding_group_needs_only_the_window_of_the_hit() -> None:
    scheduler, index = _scheduler()
    prompt = _prompt(5 * BS + 1)
    _hold(index, prompt, 0, range(5))
    _hold(index, prompt, 1, [3, 4])  # the window of the token after block 4
    assert scheduler.lookup("r", prompt, None, 0) == 5 * BS


def test_a_missing_window_block_moves_the_hit_below_it() -> None:
    scheduler, index = _scheduler()
    prompt = _prompt(5 * BS + 1)
    _hold(index, prompt, 0, range(5))
    _hold(index, prompt, 1, [0, 1, 2, 4])  # block 3 is missing
    assert scheduler.lookup("a", prompt, None, 0) == 3 * BS  # window of 3: blocks 1 and 2
    _hold(index, prompt, 1, [3])
    assert scheduler.lookup("b", prompt, None, 0) == 5 * BS


def test_the_last_window_block_missing_costs_one_block() -> None:
    scheduler, index = _scheduler()
    prompt = _prompt(5 * BS + 1)
    _hold(index, prompt, 0, range(5))
    _hold(index, prompt, 1, range(4))
    assert scheduler.lookup("r", prompt, None, 0) == 4 * BS


def test_a_hit_ends_where_the_full_attention_group_ends() -> None:
    scheduler, index = _scheduler()
    prompt = _prompt(5 * BS + 1)
    _hold(index, prompt, 0, range(3))
    _hold(index, prompt, 1, range(5))
    assert scheduler.lookup("r", prompt, None, 0) == 3 * BS


def test_no_window_held_is_no_hit() -> None:
    scheduler, index = _scheduler()
    prompt = _prompt(5 * BS + 1)
    _hold(index, prompt, 0, range(5))
    assert scheduler.lookup("r", prompt, None, 0) == 0


def test_window_blocks_below_the_computed_tokens_are_not_asked_for() -> None:
    """The engine holds the window's part below a local prefix-cache hit itself."""
    scheduler, index = _scheduler()
    prompt = _prompt(5 * BS + 1)
    _hold(index, prompt, 0, range(5))
    _hold(index, prompt, 1, [4])
    assert scheduler.lookup("r", prompt, None, 4 * BS) == BS
    assert scheduler.lookup("s", prompt, None, 3 * BS) == 0  # block 3 would come from the tier


def test_every_sliding_group_must_hold_its_own_window() -> None:
    scheduler, index = _scheduler((None, 2 * BS, 3 * BS))
    prompt = _prompt(5 * BS + 1)
    _hold(index, prompt, 0, range(5))
    _hold(index, prompt, 1, range(5))
    _hold(index, prompt, 2, [0, 1, 3, 4])  # the 3-block window of 5 needs block 2
    assert scheduler.lookup("r", prompt, None, 0) == 2 * BS


def test_a_model_with_only_a_sliding_group() -> None:
    scheduler, index = _scheduler((2 * BS,))
    prompt = _prompt(5 * BS + 1)
    _hold(index, prompt, 0, [3, 4])
    assert _keys(prompt, 0) == block_keys(NS, prompt, BS)
    assert scheduler.lookup("r", prompt, None, 0) == 5 * BS


class SlowView(MirrorIndex):
    """A tier whose every answer lands one call late (a remote store)."""

    def __init__(self) -> None:
        super().__init__(1000 * ENTRY, ENTRY)
        self.asked: set[tuple[bytes, ...]] = set()

    def count_prefix_nowait(self, keys: Sequence[BlockKey]) -> int | None:
        if tuple(keys) not in self.asked:
            self.asked.add(tuple(keys))
            return None
        return self.count_prefix(keys)


def test_a_window_lookup_may_ask_again() -> None:
    view = SlowView()
    scheduler, _ = _scheduler(view=view)
    prompt = _prompt(5 * BS + 1)
    _hold(view, prompt, 0, range(5))
    _hold(view, prompt, 1, [3, 4])
    assert scheduler.lookup("r", prompt, None, 0) is None  # the full-attention group
    assert scheduler.lookup("r", prompt, None, 0) is None  # the window
    assert scheduler.lookup("r", prompt, None, 0) == 5 * BS


# -- loads and saves -----------------------------------------------------------------------


def test_loads_skip_the_null_blocks_of_a_sliding_group() -> None:
    scheduler, index = _scheduler()
    prompt = _prompt(5 * BS + 1)
    _hold(index, prompt, 0, range(5))
    _hold(index, prompt, 1, range(5))
    assert scheduler.lookup("r", prompt, None, 0) == 5 * BS
    scheduler.on_alloc("r", ([1, 2, 3, 4, 5, 6], [0, 0, 0, 9, 10, 11]), 5 * BS)
    loads = scheduler.build([]).loads
    moves = [(t.group, t.block_id) for t in loads]
    assert moves == [(0, 1), (0, 2), (0, 3), (0, 4), (1, 9), (0, 5), (1, 10)]
    assert [t.key for t in loads if t.group == 1] == _keys(prompt, 1)[3:5]


def test_saves_skip_the_null_blocks_of_a_sliding_group() -> None:
    """Past a local prefix-cache hit the engine holds only the window of a sliding group."""
    scheduler, _ = _scheduler()
    prompt = _prompt(5 * BS + 1)
    scheduler.lookup("r", prompt, None, 3 * BS)
    tables = ([1, 2, 3, 4, 5, 6], [NULL_BLOCK, 8, 9, 10, 11, 12])
    plan = scheduler.build([ScheduledRequest("r", 3 * BS, 2 * BS + 1, tables)])
    moves = [(t.group, t.block_id) for t in plan.saves]
    assert moves == [(0, 1), (0, 2), (1, 8), (0, 3), (1, 9), (0, 4), (1, 10), (0, 5), (1, 11)]
    assert plan.tables == {"r": [1, 2, 8, 3, 9, 4, 10, 5, 11]}


def test_a_block_that_failed_to_load_taints_later_blocks_of_every_group() -> None:
    scheduler, _ = _scheduler()
    prompt = _prompt(4 * BS + 1)
    scheduler.lookup("r", prompt, None, 0)
    plan = scheduler.build([ScheduledRequest("r", 0, 4 * BS, ([1, 2, 3, 4], [5, 6, 7, 8]))])
    assert plan.blocks_computed_over({6}) == {6, 3, 7, 4, 8}
    assert plan.blocks_computed_over({2}) == {2, 6, 3, 7, 4, 8}
