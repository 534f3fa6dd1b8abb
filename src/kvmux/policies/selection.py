"""Which children load which part of a request's prefix: the selection policies.

A policy is asked through ``ask(child, start)`` (the child's offer from ``start`` on, or
None while it is still looking) and answers with the contributions, or None to be asked
again at the next step. ``first`` and ``longest`` are one rule, ``BestOffer``, with
another cap; ``compose`` chains children along the prefix.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

__all__ = ["Ask", "BestOffer", "Compose", "Contribution", "Offer", "SelectionPolicy"]


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


_new = tuple.__new__  # Contribution(...) without NamedTuple's Python-level __new__ (per hit)
# ask(child, start) -> the child's offer, or None while it is still looking
Ask = Callable[[int, int], Offer | None]


class SelectionPolicy(Protocol):
    """Picks the children that load a request whose first ``start`` tokens are computed."""

    name: str

    def select(
        self, ask: Ask, offset_capable: Sequence[bool], start: int, block_size: int
    ) -> list[Contribution] | None:
        """The contributions, in token order; None while some child is still looking.

        ``offset_capable[i]`` says whether child ``i`` can load a range that starts past
        the computed tokens.
        """


class BestOffer:
    """Ask every child from ``start`` on; the best-scoring offer loads, the earlier on ties.

    An offer of ``tokens`` scores ``min(tokens, cap)``: with cap 1 (``first``) any offer
    scores the same, so the first child that has anything wins; with no cap
    (``longest``) the most tokens win.
    """

    def __init__(self, name: str, cap: int):
        self.name = name
        self.cap = cap

    def select(
        self, ask: Ask, offset_capable: Sequence[bool], start: int, block_size: int
    ) -> list[Contribution] | None:
        """The best offer's contribution (none if no child offers); None while one looks."""
        cap, best, top, looking = self.cap, None, 0, False
        for i in range(len(offset_capable)):
            offer = ask(i, start)
            if offer is None:
                looking = True
                continue
            score = offer.tokens if offer.tokens < cap else cap
            if score > top:
                best, top = (i, offer), score
        if looking:
            return None
        if best is None:
            return []
        i, offer = best
        return [_new(Contribution, (i, start, offer.tokens, offer.is_async))]


def first() -> BestOffer:
    """``first``: the first child in load order that has anything loads all it offers."""
    return BestOffer("first", 1)


def longest() -> BestOffer:
    """``longest``: the child offering the most tokens loads them (earlier on ties)."""
    return BestOffer("longest", sys.maxsize)


class Compose:
    """``compose``: child after child, each loading from where the one before stopped.

    A later contributor must be offset-capable and starts only on a block boundary: where
    a child's range ends inside a block, the plan stops there.
    """

    name = "compose"

    def select(
        self, ask: Ask, offset_capable: Sequence[bool], start: int, block_size: int
    ) -> list[Contribution] | None:
        """The chain of contributions from ``start`` on; None while a child it asks looks."""
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
