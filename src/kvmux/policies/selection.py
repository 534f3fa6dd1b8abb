"""Which children load which part of a request's prefix, per policy."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import NamedTuple

__all__ = ["SCORE_CAPS", "Answer", "Contribution", "Offer", "best_offer", "select"]


class Offer(NamedTuple):
    """A child's answer to a lookup starting at ``start``."""

    start: int  # first token the child would load
    tokens: int  # how many tokens it would load
    is_async: bool  # whether it loads between steps


class Contribution(NamedTuple):
    """One child loading one contiguous range of the request's tokens."""

    child: int
    start: int
    tokens: int
    is_async: bool

    @property
    def end(self) -> int:
        """First token past the range."""
        return self.start + self.tokens


# ask(child, start) -> the child's offer, or None while it is still looking
Ask = Callable[[int, int], Offer | None]
# a child's (tokens, is_async) from the computed tokens on
Answer = tuple[int, bool]

# ``first`` and ``longest`` ask every child from the computed tokens on and pick the best
# offer, the earlier child on ties: an offer of ``tokens`` scores ``min(tokens, cap)``
# (``first``: any offer scores 1, so the first one wins; ``longest``: the most tokens win)
SCORE_CAPS: dict[str, int] = {"first": 1, "longest": sys.maxsize}


def best_offer(cap: int, answers: Sequence[Answer], start: int) -> list[Contribution]:
    """The contribution of the best-scoring offer (see ``SCORE_CAPS``); none if none scores.

    MuxScheduler applies the same rule inline, in the loop that asks the children.
    """
    best, top = -1, 0
    for i, (tokens, _) in enumerate(answers):
        score = tokens if tokens < cap else cap
        if score > top:
            best, top = i, score
    if best < 0:
        return []
    tokens, is_async = answers[best]
    return [Contribution(best, start, tokens, is_async)]


def _compose(
    ask: Ask, offset_capable: Sequence[bool], start: int, block_size: int
) -> list[Contribution] | None:
    plan: list[Contribution] = []
    position = start
    for i, capable in enumerate(offset_capable):
        if position > start and position % block_size:
            break  # aligned, or nothing: no child starts loading inside a block
        if position > start and not capable:
            continue
        offer = ask(i, position)
        if offer is None:
            return None
        if offer.tokens > 0:
            plan.append(Contribution(i, position, offer.tokens, offer.is_async))
            position += offer.tokens
    return plan


def select(
    policy: str, ask: Ask, offset_capable: Sequence[bool], start: int, block_size: int
) -> list[Contribution] | None:
    """Contributions for a request whose first ``start`` tokens are computed.

    ``None`` means some child is still looking: ask again at the next step.
    ``offset_capable[i]`` says whether child ``i`` can load a range that starts past the
    computed tokens; other children take part in ``compose`` only as the first contributor.
    A later contributor starts only on a block boundary: where a child's range ends inside
    a block, ``compose`` stops there. Policies in ``SCORE_CAPS`` ask every child at ``start``.
    """
    cap = SCORE_CAPS.get(policy)
    if cap is not None:
        offers = [ask(i, start) for i in range(len(offset_capable))]
        if None in offers:
            return None
        return best_offer(cap, [(o.tokens, o.is_async) for o in offers if o is not None], start)
    if policy == "compose":
        return _compose(ask, offset_capable, start, block_size)
    raise ValueError(f"unknown policy {policy!r}")
