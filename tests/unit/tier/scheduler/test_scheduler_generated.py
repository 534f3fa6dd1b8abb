"""TierScheduler: saving the blocks a request generates (``offload_prompt_only``)."""

from __future__ import annotations

from collections.abc import Sequence

from kvmux.errors import UnkeyableInput
from kvmux.keys import block_keys, group_key
from kvmux.metrics import TierStats
from kvmux.tier.scheduler.index import MirrorIndex
from kvmux.tier.scheduler.scheduler import ScheduledRequest, TierScheduler
from tests.unit.tier.scheduler.test_scheduler import (
    BS,
    ENTRY,
    NS,
    ForgetfulView,
    _prompt,
    _scheduler,
)

PROMPT = _prompt(40, seed=1)  # two full blocks and 8 tokens
REPLY = _prompt(60, seed=2)  # generated: the whole sequence ends at 100 tokens
BLOCKS = list(range(1, 9))


def _step(
    req_id: str, computed: int, scheduled: int, tokens: Sequence[int] | None
) -> ScheduledRequest:
    return ScheduledRequest(req_id, computed, scheduled, (BLOCKS,), tokens)


def _decode(scheduler: TierScheduler, tokens_known: int, lag: int = 0) -> list[list[bytes]]:
    """Prefill PROMPT, then decode REPLY one token a step; each step's saved keys.

    ``lag``: tokens the step computes that are not among its known tokens yet (vLLM's
    asynchronous scheduling learns a sampled token one step late).
    """
    assert scheduler.lookup("r", PROMPT, None, 0) == 0
    scheduler.on_alloc("r", (BLOCKS,), 0)
    sequence = PROMPT + REPLY
    saved = [[t.key for t in scheduler.build([_step("r", 0, len(PROMPT), PROMPT)]).saves]]
    for computed in range(len(PROMPT), tokens_known):
        known = sequence[: computed + 1 - lag]
        step = _step("r", computed, 1, known)
        saved.append([t.key for t in scheduler.build([step]).saves])
    return saved


def test_without_tokens_only_prompt_blocks_are_saved() -> None:
    scheduler, _, _ = _scheduler()
    scheduler.lookup("r", PROMPT, None, 0)
    scheduler.on_alloc("r", (BLOCKS,), 0)
    saves = scheduler.build([_step("r", 0, 40, None)]).saves
    for computed in range(40, 99):
        saves += scheduler.build([_step("r", computed, 1, None)]).saves
    assert [t.key for t in saves] == block_keys(NS, PROMPT, BS)


def test_generated_blocks_are_saved_in_the_step_that_fills_them() -> None:
    scheduler, _, _ = _scheduler()
    saved = _decode(scheduler, 99)  # the last token's KV is never computed
    expected = block_keys(NS, PROMPT + REPLY, BS)
    assert saved[0] == expected[:2]
    # step i computes position 40 + i - 1: block b is full once position 16 * b + 15 is
    steps = {i: keys for i, keys in enumerate(saved) if keys}
    assert len(expected) == 6
    assert steps == {
        0: expected[:2],
        8: [expected[2]],
        24: [expected[3]],
        40: [expected[4]],
        56: [expected[5]],
    }


def test_the_next_turn_is_found_through_the_reply() -> None:
    scheduler, _, _ = _scheduler()
    _decode(scheduler, 99)
    scheduler.finish("r")
    turn = PROMPT + REPLY + _prompt(30, seed=3)
    assert scheduler.lookup("t2", turn, None, 0) == 6 * BS  # every full block of 99 tokens


def test_prompt_only_the_next_turn_finds_the_prompt() -> None:
    scheduler, _, _ = _scheduler()
    scheduler.lookup("r", PROMPT, None, 0)
    scheduler.on_alloc("r", (BLOCKS,), 0)
    scheduler.build([_step("r", 0, 40, None)])
    for computed in range(40, 99):
        scheduler.build([_step("r", computed, 1, None)])
    turn = PROMPT + REPLY + _prompt(30, seed=3)
    assert scheduler.lookup("t2", turn, None, 0) == 2 * BS


def test_a_token_learned_late_delays_the_save_by_a_step() -> None:
    scheduler, _, _ = _scheduler()
    saved = _decode(scheduler, 99, lag=1)
    expected = block_keys(NS, PROMPT + REPLY, BS)
    steps = {i: keys for i, keys in enumerate(saved) if keys}
    assert steps[9] == [expected[2]] and 8 not in steps
    assert [k for keys in saved for k in keys] == expected


def test_blocks_past_the_known_tokens_are_never_saved() -> None:
    """A step that computes draft tokens: only the tokens known (accepted) are keyed."""
    scheduler, _, _ = _scheduler()
    scheduler.lookup("r", PROMPT, None, 0)
    scheduler.on_alloc("r", (BLOCKS,), 0)
    scheduler.build([_step("r", 0, 40, PROMPT)])
    known = (PROMPT + REPLY)[:45]
    saves = scheduler.build([_step("r", 44, 6, known)]).saves  # positions 44..49: 5 drafts
    assert saves == []
    known = (PROMPT + REPLY)[:49]
    saves = scheduler.build([_step("r", 48, 3, known)]).saves
    assert [t.key for t in saves] == [block_keys(NS, known, BS)[2]]


def test_a_preempted_request_saves_its_generated_blocks_again() -> None:
    view = ForgetfulView()
    scheduler = TierScheduler(view, BS, NS, TierStats())
    scheduler.lookup("r", PROMPT, None, 0)
    scheduler.on_alloc("r", (BLOCKS,), 0)
    sequence = PROMPT + REPLY
    scheduler.build([_step("r", 0, 40, PROMPT)])
    for computed in range(40, 70):
        scheduler.build([_step("r", computed, 1, sequence[: computed + 1])])
    # preempted, then recomputed from scratch in new blocks, prompt and reply so far
    again = [17, 18, 19, 20, 21]
    step = ScheduledRequest("r", 0, 70, (again,), sequence[:70])
    saves = scheduler.build([step]).saves
    expected = block_keys(NS, sequence[:70], BS)
    assert [(t.key, t.block_id) for t in saves] == list(zip(expected, again, strict=False))


def test_generated_blocks_carry_the_extra_keys() -> None:
    scheduler, _, _ = _scheduler()
    extras_of = lambda n: [b"lora"] * (n // BS)  # noqa: E731
    scheduler.lookup("r", PROMPT, extras_of(40), 0)
    scheduler.on_alloc("r", (BLOCKS,), 0)
    sequence = PROMPT + REPLY
    keys = [t.key for t in scheduler.build([_step("r", 0, 40, PROMPT)]).saves]
    for computed in range(40, 60):
        step = ScheduledRequest("r", computed, 1, (BLOCKS,), sequence[: computed + 1], extras_of)
        keys += [t.key for t in scheduler.build([step]).saves]
    assert keys == block_keys(NS, sequence[:60], BS, extras_of(60))
    assert keys[:3] != block_keys(NS, sequence[:60], BS)


def test_unkeyable_generated_blocks_are_not_saved() -> None:
    def unkeyable(n: int) -> Sequence[bytes]:
        raise UnkeyableInput("no")

    scheduler, _, _ = _scheduler()
    scheduler.lookup("r", PROMPT, None, 0)
    scheduler.on_alloc("r", (BLOCKS,), 0)
    sequence = PROMPT + REPLY
    saves = scheduler.build([_step("r", 0, 40, PROMPT)]).saves
    for computed in range(40, 99):
        step = ScheduledRequest("r", computed, 1, (BLOCKS,), sequence[: computed + 1], unkeyable)
        saves += scheduler.build([step]).saves
    assert [t.key for t in saves] == block_keys(NS, PROMPT, BS)


def test_every_group_saves_its_generated_blocks() -> None:
    view = MirrorIndex(1000 * ENTRY, ENTRY)
    scheduler = TierScheduler(view, BS, NS, TierStats(), windows=(None, 32))
    tables = (BLOCKS, [*BLOCKS[:2], 0, *BLOCKS[3:]])  # window group: block 2 out of window
    scheduler.lookup("r", PROMPT, None, 0)
    scheduler.on_alloc("r", tables, 0)
    sequence = PROMPT + REPLY
    scheduler.build([ScheduledRequest("r", 0, 40, tables, PROMPT)])
    saves = []
    for computed in range(40, 64):
        step = ScheduledRequest("r", computed, 1, tables, sequence[: computed + 1])
        saves += scheduler.build([step]).saves
    keys = block_keys(NS, sequence, BS)
    assert [(t.key, t.group) for t in saves] == [
        (keys[2], 0),
        (keys[3], 0),
        (group_key(keys[3], 1), 1),
    ]
