"""kvmux.tier.scheduler.scheduler: lookups, load plans and save plans of one tier (pure Python)."""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence

import pytest

from kvmux.keys import BlockKey, block_keys, encode_extra_keys, namespace_id
from kvmux.metrics import TierStats
from kvmux.tier.scheduler.index import MirrorIndex, TierView
from kvmux.tier.scheduler.plan import BlockTransfer, TierStepPlan
from kvmux.tier.scheduler.scheduler import ScheduledRequest, TierScheduler

NS = namespace_id({"m": "x"})
BS = 16
ENTRY = 1000


def _prompt(length: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 50_000) for _ in range(length)]


def _keys(
    prompt: Sequence[int], extras: Sequence[bytes] | None = None, block_size: int = BS
) -> list[BlockKey]:
    return block_keys(NS, prompt, block_size, extras)


def _scheduler(
    view: TierView | None = None, block_size: int = BS, entries: int = 1000
) -> tuple[TierScheduler, TierView, TierStats]:
    view = view if view is not None else MirrorIndex(entries * ENTRY, ENTRY)
    stats = TierStats()
    return TierScheduler(view, block_size, NS, stats), view, stats


def _new_request(
    scheduler: TierScheduler,
    req_id: str,
    prompt: Sequence[int],
    block_ids: Sequence[int],
    num_computed: int = 0,
    extras: Sequence[bytes] | None = None,
) -> int:
    """lookup + on_alloc accepting everything offered; returns the external tokens."""
    hit = scheduler.lookup(req_id, prompt, extras, num_computed)
    scheduler.on_alloc(req_id, (block_ids,), hit)
    return hit


def _one_group(
    req_id: str, num_computed: int, num_scheduled: int, block_ids: Sequence[int]
) -> ScheduledRequest:
    """A scheduled request of a model with one KV cache group."""
    return ScheduledRequest(req_id, num_computed, num_scheduled, (block_ids,))


class ForgetfulView(TierView):
    """A tier that holds whatever count_prefix is told, and never admits saves."""

    def __init__(self, held: int = 0):
        self.held = held
        self.saved: list[bytes] = []
        self.forgotten: list[bytes] = []

    def count_prefix(self, keys: Sequence[bytes]) -> int:
        return min(self.held, len(keys))

    def contains(self, key: bytes) -> bool:
        return False

    def record_saved(self, keys: Iterable[bytes]) -> list[bytes]:
        self.saved.extend(keys)
        return []

    def forget(self, keys: Iterable[bytes]) -> None:
        self.forgotten.extend(keys)


# -- lookup ----------------------------------------------------------------------


def test_lookup_never_claims_the_last_prompt_token() -> None:
    scheduler, view, _ = _scheduler()
    prompt = _prompt(2 * BS)
    view.record_saved(_keys(prompt))
    assert view.count_prefix(_keys(prompt)) == 2
    assert scheduler.lookup("r", prompt, None, 0) == BS


@pytest.mark.parametrize(
    ("length", "expected_blocks"),
    [(1, 0), (BS - 1, 0), (BS, 0), (BS + 1, 1), (2 * BS, 1), (2 * BS + 1, 2), (5 * BS, 4)],
)
def test_lookup_claims_every_full_block_before_the_last_token(
    length: int, expected_blocks: int
) -> None:
    scheduler, view, _ = _scheduler()
    prompt = _prompt(length)
    view.record_saved(_keys(prompt))
    hit = scheduler.lookup("r", prompt, None, 0)
    assert hit == expected_blocks * BS
    assert hit < length


def test_lookup_of_an_empty_tier() -> None:
    scheduler, _, _ = _scheduler()
    assert scheduler.lookup("r", _prompt(10 * BS), None, 0) == 0


def test_lookup_starts_at_num_computed() -> None:
    scheduler, view, _ = _scheduler()
    prompt = _prompt(4 * BS + 1)
    keys = _keys(prompt)
    view.record_saved(keys[2:])  # the tier holds blocks 2 and 3 only
    assert scheduler.lookup("a", prompt, None, 0) == 0
    assert scheduler.lookup("b", prompt, None, BS) == 0
    assert scheduler.lookup("c", prompt, None, 2 * BS) == 2 * BS
    assert scheduler.lookup("d", prompt, None, 3 * BS) == BS
    assert scheduler.lookup("e", prompt, None, 4 * BS) == 0


@pytest.mark.parametrize("offset", [1, BS // 2, BS - 1])
def test_lookup_from_inside_a_block_offers_nothing(offset: int) -> None:
    """Aligned, or nothing: rounding the start down would load over computed tokens."""
    scheduler, view, _ = _scheduler()
    prompt = _prompt(4 * BS + 1)
    view.record_saved(_keys(prompt))
    assert scheduler.lookup("r", prompt, None, BS + offset) == 0


def test_lookup_past_local_hits_of_a_fully_held_prompt() -> None:
    scheduler, view, _ = _scheduler()
    prompt = _prompt(4 * BS + 1)
    view.record_saved(_keys(prompt))
    assert scheduler.lookup("r", prompt, None, BS) == 3 * BS


def test_lookup_stops_at_a_gap() -> None:
    scheduler, view, _ = _scheduler()
    prompt = _prompt(5 * BS)
    keys = _keys(prompt)
    view.record_saved([keys[0], keys[1], keys[3]])
    assert scheduler.lookup("r", prompt, None, 0) == 2 * BS


def test_lookup_uses_the_extra_keys() -> None:
    scheduler, view, _ = _scheduler()
    prompt = _prompt(3 * BS)
    view.record_saved(_keys(prompt))
    salted = [encode_extra_keys((("cache_salt", "tenant"),)), b"", b""]
    lora = [encode_extra_keys((("lora", "adapter", "/adapters/a"),))] * 3
    assert scheduler.lookup("plain", prompt, None, 0) == 2 * BS
    assert scheduler.lookup("salted", prompt, salted, 0) == 0
    assert scheduler.lookup("lora", prompt, lora, 0) == 0


def test_lookup_repeated_for_the_same_request_keeps_its_keys() -> None:
    scheduler, view, _ = _scheduler()
    prompt = _prompt(3 * BS)
    view.record_saved(_keys(prompt))
    assert scheduler.lookup("r", prompt, None, 0) == 2 * BS
    assert scheduler.lookup("r", prompt, None, BS) == BS


# -- loads -----------------------------------------------------------------------


def test_on_alloc_and_build_plan_loads_into_the_right_blocks() -> None:
    scheduler, view, stats = _scheduler()
    prompt = _prompt(4 * BS + 1)
    keys = _keys(prompt)
    view.record_saved(keys)
    block_ids = [10, 11, 12, 13, 14]
    hit = scheduler.lookup("r", prompt, None, BS)  # block 0 is a local prefix-cache hit
    assert hit == 3 * BS
    scheduler.on_alloc("r", (block_ids,), hit)
    plan = scheduler.build([_one_group("r", BS + hit, 1, block_ids)])
    assert plan.loads == [
        BlockTransfer(keys[1], 11),
        BlockTransfer(keys[2], 12),
        BlockTransfer(keys[3], 13),
    ]
    assert plan.saves == []
    assert stats.lookups == 1
    assert stats.hit_tokens == 3 * BS
    # loads are planned once
    assert scheduler.build([_one_group("r", 4 * BS + 1, 1, block_ids)]).loads == []


def test_on_alloc_of_fewer_tokens_than_offered() -> None:
    scheduler, view, stats = _scheduler()
    prompt = _prompt(4 * BS + 1)
    keys = _keys(prompt)
    view.record_saved(keys)
    assert scheduler.lookup("r", prompt, None, 0) == 4 * BS
    scheduler.on_alloc("r", ([5, 6, 7, 8, 9],), BS)
    plan = scheduler.build([])
    assert plan.loads == [BlockTransfer(keys[0], 5)]
    assert stats.hit_tokens == BS


def test_on_alloc_of_zero_tokens_plans_nothing_but_counts_the_lookup() -> None:
    scheduler, view, stats = _scheduler()
    prompt = _prompt(3 * BS)
    view.record_saved(_keys(prompt))
    scheduler.lookup("r", prompt, None, 0)
    scheduler.on_alloc("r", ([1, 2, 3],), 0)
    assert scheduler.build([]) == TierStepPlan(step=1)
    assert (stats.lookups, stats.hit_tokens) == (1, 0)


def test_on_alloc_without_a_lookup_is_ignored() -> None:
    scheduler, _, stats = _scheduler()
    scheduler.on_alloc("unknown", ([1, 2],), 2 * BS)
    prompt = _prompt(3 * BS)
    scheduler.lookup("r", prompt, None, 0)
    scheduler.on_alloc("r", ([1, 2, 3],), 0)
    scheduler.on_alloc("r", ([1, 2, 3],), 2 * BS)  # the lookup was consumed already
    assert scheduler.build([]).loads == []
    assert stats.lookups == 1


def test_loads_of_several_requests_in_one_step() -> None:
    scheduler, view, _ = _scheduler()
    first, second = _prompt(3 * BS, seed=1), _prompt(2 * BS + 1, seed=2)
    view.record_saved(_keys(first) + _keys(second))
    _new_request(scheduler, "a", first, [0, 1, 2])
    _new_request(scheduler, "b", second, [7, 8, 9])
    plan = scheduler.build([])
    assert plan.loads == [
        BlockTransfer(_keys(first)[0], 0),
        BlockTransfer(_keys(first)[1], 1),
        BlockTransfer(_keys(second)[0], 7),
        BlockTransfer(_keys(second)[1], 8),
    ]


# -- saves -----------------------------------------------------------------------


def test_build_saves_newly_full_prompt_blocks() -> None:
    scheduler, view, _ = _scheduler()
    prompt = _prompt(3 * BS + 5)
    keys = _keys(prompt)
    ids = [4, 5, 6, 7]
    _new_request(scheduler, "r", prompt, ids)
    plan = scheduler.build([_one_group("r", 0, len(prompt), ids)])
    assert plan.loads == []
    assert plan.saves == [BlockTransfer(k, b) for k, b in zip(keys, ids[:3], strict=True)]
    assert plan.evictions == []
    assert all(view.contains(k) for k in keys)


@pytest.mark.parametrize("view_kind", ["mirror", "forgetful"])
def test_chunked_prefill_saves_each_block_once(view_kind: str) -> None:
    view: TierView = MirrorIndex(100 * ENTRY, ENTRY) if view_kind == "mirror" else ForgetfulView()
    scheduler, _, _ = _scheduler(view, block_size=64)
    prompt = _prompt(300)
    keys = _keys(prompt, block_size=64)
    assert len(keys) == 4
    ids = [20, 21, 22, 23, 24]
    _new_request(scheduler, "r", prompt, ids[:2])

    step1 = scheduler.build([_one_group("r", 0, 100, ids[:2])])
    assert step1.saves == [BlockTransfer(keys[0], 20)]
    step2 = scheduler.build([_one_group("r", 100, 100, ids[:4])])
    assert step2.saves == [BlockTransfer(keys[1], 21), BlockTransfer(keys[2], 22)]
    step3 = scheduler.build([_one_group("r", 200, 100, ids[:5])])
    assert step3.saves == [BlockTransfer(keys[3], 23)]
    # decode steps: the output tokens are never saved
    for done in range(300, 400):
        assert scheduler.build([_one_group("r", done, 1, ids)]).saves == []
    if isinstance(view, ForgetfulView):
        assert view.saved == keys


def test_saves_never_include_blocks_just_loaded() -> None:
    # The view claims every block and never remembers saves, so only the scheduler's
    # own record of the load keeps the loaded blocks out of the save plan.
    view = ForgetfulView(held=100)
    scheduler, _, _ = _scheduler(view)
    prompt = _prompt(4 * BS + 1)
    keys = _keys(prompt)
    ids = [30, 31, 32, 33, 34]
    hit = scheduler.lookup("r", prompt, None, BS)  # block 0 is a local prefix-cache hit
    assert hit == 3 * BS
    scheduler.on_alloc("r", (ids,), 2 * BS)  # the engine takes blocks 1 and 2
    plan = scheduler.build([_one_group("r", 3 * BS, BS + 1, ids)])
    assert plan.loads == [BlockTransfer(keys[1], 31), BlockTransfer(keys[2], 32)]
    saved = {t.key for t in plan.saves}
    assert keys[1] not in saved
    assert keys[2] not in saved
    assert plan.saves == [BlockTransfer(keys[0], 30), BlockTransfer(keys[3], 33)]


def test_saves_carry_each_request_table_up_to_its_last_save() -> None:
    view = ForgetfulView()
    scheduler, _, _ = _scheduler(view)
    _new_request(scheduler, "a", _prompt(3 * BS), [5, 6, 7])
    _new_request(scheduler, "b", _prompt(3 * BS, seed=2), [8, 9, 10])
    plan = scheduler.build(
        [_one_group("a", 0, 2 * BS, [5, 6, 7]), _one_group("b", 0, 1, [8, 9, 10])]
    )
    assert plan.tables == {"a": [5, 6]}  # "b" has no full block yet: nothing to save


def test_a_recomputed_range_is_saved_again() -> None:
    """A failed load sends the engine back to block 2: blocks from there are saved anew."""
    view = ForgetfulView()
    scheduler, _, _ = _scheduler(view)
    prompt = _prompt(6 * BS + 1)
    keys = _keys(prompt)
    ids = [10, 11, 12, 13, 14, 15, 16]
    _new_request(scheduler, "r", prompt, ids)
    first = scheduler.build([_one_group("r", 0, 5 * BS, ids)])
    assert [t.key for t in first.saves] == keys[:5]
    # the workers failed to load block 2 (say): the engine recomputes from there
    again = scheduler.build([_one_group("r", 2 * BS, 4 * BS + 1, ids)])
    assert [t.key for t in again.saves] == keys[2:6]
    assert again.tables == {"r": ids[:6]}


def test_blocks_the_tier_holds_are_not_saved_again() -> None:
    scheduler, view, _ = _scheduler()
    prompt = _prompt(3 * BS)
    keys = _keys(prompt)
    view.record_saved([keys[1]])
    _new_request(scheduler, "r", prompt, [0, 1, 2])  # gap at block 0: no hit
    plan = scheduler.build([_one_group("r", 0, 3 * BS, [0, 1, 2])])
    assert plan.saves == [BlockTransfer(keys[0], 0), BlockTransfer(keys[2], 2)]


def test_duplicate_keys_across_requests_in_one_step_are_saved_once() -> None:
    scheduler, view, _ = _scheduler()
    prompt = _prompt(2 * BS + 5)
    keys = _keys(prompt)
    _new_request(scheduler, "a", prompt, [0, 1, 2])
    _new_request(scheduler, "b", prompt, [3, 4, 5])
    plan = scheduler.build(
        [
            _one_group("a", 0, len(prompt), [0, 1, 2]),
            _one_group("b", 0, len(prompt), [3, 4, 5]),
        ]
    )
    assert [t.key for t in plan.saves] == keys
    assert len(plan.saves) == 2
    for transfer, a_block, b_block in zip(plan.saves, [0, 1], [3, 4], strict=True):
        assert transfer.block_id in (a_block, b_block)
    assert isinstance(view, MirrorIndex)
    assert len(view) == 2
    # a third request with the same prompt now hits
    assert scheduler.lookup("c", prompt, None, 0) == 2 * BS


def test_shared_prefix_across_requests_is_saved_once() -> None:
    scheduler, _, _ = _scheduler()
    prefix = _prompt(BS, seed=9)
    first, second = prefix + _prompt(BS, seed=1), prefix + _prompt(BS, seed=2)
    _new_request(scheduler, "a", first, [0, 1])
    _new_request(scheduler, "b", second, [2, 3])
    plan = scheduler.build([_one_group("a", 0, 2 * BS, [0, 1]), _one_group("b", 0, 2 * BS, [2, 3])])
    keys = [t.key for t in plan.saves]
    assert len(keys) == len(set(keys)) == 3
    assert set(keys) == set(_keys(first)) | set(_keys(second))


def test_requests_without_state_are_ignored_by_build() -> None:
    scheduler, _, _ = _scheduler()
    plan = scheduler.build([_one_group("never-looked-up", 0, 4 * BS, [0, 1, 2, 3])])
    assert plan == TierStepPlan(step=1)


def test_saves_are_bounded_by_the_allocated_blocks() -> None:
    scheduler, _, _ = _scheduler()
    prompt = _prompt(4 * BS)
    keys = _keys(prompt)
    _new_request(scheduler, "r", prompt, [0, 1])
    plan = scheduler.build([_one_group("r", 0, 4 * BS, [0, 1])])
    assert plan.saves == [BlockTransfer(keys[0], 0), BlockTransfer(keys[1], 1)]


# -- evictions ---------------------------------------------------------------------


def test_evictions_are_emitted_when_capacity_is_exceeded() -> None:
    scheduler, view, _ = _scheduler(entries=3)
    first, second = _prompt(3 * BS, seed=1), _prompt(2 * BS, seed=2)
    _new_request(scheduler, "a", first, [0, 1, 2])
    plan = scheduler.build([_one_group("a", 0, 3 * BS, [0, 1, 2])])
    assert len(plan.saves) == 3
    assert plan.evictions == []
    _new_request(scheduler, "b", second, [3, 4])
    plan = scheduler.build([_one_group("b", 0, 2 * BS, [3, 4])])
    assert [t.key for t in plan.saves] == _keys(second)
    assert plan.evictions == _keys(first)[:2]
    assert plan != TierStepPlan()
    assert isinstance(view, MirrorIndex)
    assert len(view) == 3
    assert scheduler.lookup("c", [*first, 1], None, 0) == 0


def test_looked_up_blocks_are_evicted_last() -> None:
    scheduler, _, _ = _scheduler(entries=3)
    first = _prompt(2 * BS, seed=1)
    _new_request(scheduler, "a", first, [0, 1])
    scheduler.build([_one_group("a", 0, 2 * BS, [0, 1])])
    other = _prompt(BS, seed=5)
    _new_request(scheduler, "o", other, [9])
    scheduler.build([_one_group("o", 0, BS, [9])])
    # a lookup touches block 0 of the first prompt: it is now the most recently used
    assert scheduler.lookup("hit", first, None, 0) == BS
    newcomer = _prompt(BS, seed=6)
    _new_request(scheduler, "n", newcomer, [10])
    plan = scheduler.build([_one_group("n", 0, BS, [10])])
    assert plan.evictions == [_keys(first)[1]]


def test_a_step_never_saves_and_evicts_the_same_key() -> None:
    scheduler, view, _ = _scheduler(entries=2)
    prompt = _prompt(4 * BS + 1)
    _new_request(scheduler, "r", prompt, [0, 1, 2, 3, 4])
    plan = scheduler.build([_one_group("r", 0, len(prompt), [0, 1, 2, 3, 4])])
    saved = {t.key for t in plan.saves}
    assert not saved & set(plan.evictions)
    assert all(view.contains(t.key) for t in plan.saves)


# -- forget / finish -------------------------------------------------------------


def test_forget_drops_keys_from_the_view() -> None:
    scheduler, view, _ = _scheduler()
    prompt = _prompt(4 * BS + 1)
    keys = _keys(prompt)
    view.record_saved(keys)
    scheduler.forget([keys[2]])
    assert not view.contains(keys[2])
    assert scheduler.lookup("r", prompt, None, 0) == 2 * BS


def test_finish_drops_request_state() -> None:
    scheduler, view, _ = _scheduler()
    old, new = _prompt(3 * BS, seed=1), _prompt(3 * BS, seed=2)
    view.record_saved(_keys(new))
    assert scheduler.lookup("r", old, None, 0) == 0
    scheduler.finish("r")
    # the keys are derived afresh from the new prompt under the reused id
    assert scheduler.lookup("r", new, None, 0) == 2 * BS
    scheduler.on_alloc("r", ([0, 1, 2],), 2 * BS)
    scheduler.finish("r")
    scheduler.finish("r")  # finishing twice, or an unknown request, is fine
    scheduler.finish("unknown")
    plan = scheduler.build([_one_group("r", 2 * BS, BS, [0, 1, 2])])
    assert plan.saves == []
    assert [t.block_id for t in plan.loads] == [0, 1]  # planned before finish


def test_finished_request_is_not_saved() -> None:
    scheduler, view, _ = _scheduler()
    prompt = _prompt(3 * BS)
    _new_request(scheduler, "r", prompt, [0, 1, 2])
    scheduler.finish("r")
    assert scheduler.build([_one_group("r", 0, 3 * BS, [0, 1, 2])]) == TierStepPlan(step=1)
    assert isinstance(view, MirrorIndex)
    assert len(view) == 0


# -- reset: a new generation -------------------------------------------------------------


def test_after_a_reset_nothing_stored_before_is_offered() -> None:
    scheduler, _, _ = _scheduler()
    prompt = _prompt(4 * BS + 1)
    _new_request(scheduler, "before", prompt, [1, 2, 3, 4, 5])
    stored = scheduler.build([_one_group("before", 0, 4 * BS + 1, [1, 2, 3, 4, 5])])
    assert len(stored.saves) == 4
    assert scheduler.lookup("again", prompt, None, 0) == 4 * BS
    assert scheduler.reset()
    assert scheduler.lookup("after", prompt, None, 0) == 0
    plan = scheduler.build([_one_group("after", 0, 4 * BS + 1, [6, 7, 8, 9, 10])])
    assert set(plan.evictions) == {t.key for t in stored.saves}  # the workers drop them
    assert {t.key for t in plan.saves}.isdisjoint(plan.evictions)  # new keys
    assert scheduler.lookup("later", prompt, None, 0) == 4 * BS  # the new generation's


class UnknownGeneration(ForgetfulView):
    """A shared tier whose generation cannot be read right now."""

    def generation(self) -> bytes | None:
        return None


def test_a_request_is_neither_loaded_nor_saved_while_the_generation_is_unknown() -> None:
    scheduler, _, _ = _scheduler(UnknownGeneration(held=100))
    prompt = _prompt(3 * BS + 1)
    assert _new_request(scheduler, "r", prompt, [1, 2, 3, 4]) == 0
    assert scheduler.build([_one_group("r", 0, 3 * BS + 1, [1, 2, 3, 4])]).saves == []


# -- asynchronous loads ---------------------------------------------------------------


def _async_scheduler(held: int = 100) -> tuple[TierScheduler, ForgetfulView]:
    view = ForgetfulView(held=held)
    return TierScheduler(view, BS, NS, TierStats(), async_loads=True), view


def test_an_async_load_is_one_request_load_position_by_position() -> None:
    scheduler, _ = _async_scheduler()
    prompt = _prompt(4 * BS + 1)
    keys = _keys(prompt)
    ids = [30, 31, 32, 33, 34]
    assert scheduler.lookup("r", prompt, None, BS) == 3 * BS  # block 0: a local hit
    scheduler.on_alloc("r", (ids,), 3 * BS)
    plan = scheduler.build([])  # the request waits for its load: not scheduled
    assert plan.loads == []
    (load,) = plan.async_loads
    assert (load.req_id, load.start) == ("r", 1)
    assert load.positions == tuple((BlockTransfer(keys[i], ids[i]),) for i in (1, 2, 3))
    assert scheduler.build([]).async_loads == []  # started once


def test_the_second_alloc_of_an_async_request_plans_nothing() -> None:
    """vLLM calls update_state_after_alloc again, with no external tokens, once loaded."""
    scheduler, _ = _async_scheduler()
    prompt = _prompt(4 * BS + 1)
    ids = [30, 31, 32, 33, 34]
    _new_request(scheduler, "r", prompt, ids)
    scheduler.build([])
    scheduler.on_alloc("r", (ids,), 0)
    plan = scheduler.build([_one_group("r", 4 * BS, 1, ids)])
    assert plan.loads == plan.async_loads == plan.saves == []  # loaded blocks: not saved


def test_after_a_failed_async_load_the_recomputed_blocks_are_saved() -> None:
    """The load failed at block 2: the engine runs the request from there, and blocks 2
    and 3, though promised by the load, are saved once computed."""
    scheduler, _ = _async_scheduler()
    prompt = _prompt(4 * BS + 1)
    keys = _keys(prompt)
    ids = [30, 31, 32, 33, 34]
    _new_request(scheduler, "r", prompt, ids)
    scheduler.build([])
    scheduler.on_alloc("r", (ids,), 0)
    plan = scheduler.build([_one_group("r", 2 * BS, 2 * BS + 1, ids)])
    assert plan.saves == [BlockTransfer(keys[2], 32), BlockTransfer(keys[3], 33)]


def test_a_failed_load_is_never_offered_again_past_its_failure() -> None:
    """vLLM looks a request up again after a failed load that left it nothing: it gets
    the blocks below the failure, and nothing at all after a failure at its first block."""
    scheduler, _ = _async_scheduler()
    prompt = _prompt(6 * BS + 1)
    assert _new_request(scheduler, "r", prompt, list(range(1, 8))) == 6 * BS
    scheduler.failed_load("r", 4)
    assert scheduler.lookup("r", prompt, None, 0) == 4 * BS
    scheduler.failed_load("r", 0)
    assert scheduler.lookup("r", prompt, None, 0) == 0
    assert scheduler.lookup("other", prompt, None, 0) == 6 * BS  # only that request
    scheduler.failed_load("gone", 0)  # a finished request: nothing to do


def test_sync_and_async_schedulers_load_the_same_blocks() -> None:
    prompt = _prompt(5 * BS + 1)
    ids = [40, 41, 42, 43, 44, 45]
    sync, _, _ = _scheduler(ForgetfulView(held=100))
    _new_request(sync, "r", prompt, ids, num_computed=BS)
    asynchronous, _ = _async_scheduler()
    _new_request(asynchronous, "r", prompt, ids, num_computed=BS)
    (load,) = asynchronous.build([]).async_loads
    assert load.transfers == sync.build([]).loads


def test_plans_are_numbered_and_fence_blocks_saved_before_their_reuse() -> None:
    view = MirrorIndex(1000 * ENTRY, ENTRY)
    scheduler = TierScheduler(view, BS, NS, TierStats(), fence_saves=True)
    prompt = _prompt(2 * BS + 1)
    _new_request(scheduler, "a", prompt, [4, 5, 6])
    first = scheduler.build([_one_group("a", 0, len(prompt), [4, 5, 6])], allocated=[4, 5, 6])
    assert (first.step, first.fence) == (1, 0)
    assert [t.block_id for t in first.saves] == [4, 5]
    scheduler.finish("a")
    other = _prompt(BS, seed=1)
    _new_request(scheduler, "b", other, [5, 9])  # block 5 freed and given to "b"
    second = scheduler.build([_one_group("b", 0, len(other), [5, 9])], allocated=[5, 9])
    assert (second.step, second.fence) == (2, 1)
    third = scheduler.build([], allocated=[6])
    assert (third.step, third.fence) == (3, 0)  # block 6 was never saved


def test_without_asynchronous_saves_nothing_is_fenced() -> None:
    scheduler, _, _ = _scheduler()
    prompt = _prompt(2 * BS + 1)
    _new_request(scheduler, "a", prompt, [4, 5, 6])
    scheduler.build([_one_group("a", 0, len(prompt), [4, 5, 6])])
    plan = scheduler.build([], allocated=[4, 5])
    assert (plan.step, plan.fence) == (2, 0)
