"""Which children load which part of a request's prefix, per policy."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["Contribution", "Offer", "select"]


@dataclass(frozen=True)
class Offer:
    """A child's answer to a lookup starting at ``start``."""

    start: int  # first token the child would load
    tokens: int  # how many tokens it would load
    is_async: bool  # whether it loads between steps


@dataclass(frozen=True)
class Contribution:
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


def _first(ask: Ask, count: int, start: int) -> list[Contribution] | None:
    offers = [ask(i, start) for i in range(count)]
    known = [o for o in offers if o is not None]
    if len(known) < count:
        return None
    for i, offer in enumerate(known):
        if offer.tokens > 0:
            return [Contribution(i, start, offer.tokens, offer.is_async)]
    return []


def _longest(ask: Ask, count: int, start: int) -> list[Contribution] | None:
    offers = [ask(i, start) for i in range(count)]
    known = [o for o in offers if o is not None]
    if len(known) < count:
        return None
    best = max(range(count), key=lambda i: (known[i].tokens, -i), default=None)
    if best is None or known[best].tokens <= 0:
        return []
    return [Contribution(best, start, known[best].tokens, known[best].is_async)]


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
    a block, ``compose`` stops there.
    """
    count = len(offset_capable)
    if policy == "first":
        return _first(ask, count, start)
    if policy == "longest":
        return _longest(ask, count, start)
    if policy == "compose":
        return _compose(ask, offset_capable, start, block_size)
    raise ValueError(f"unknown policy {policy!r}")
