"""A policy registered by name in a test: the last child that offers anything loads."""

from __future__ import annotations

from collections.abc import Sequence

from kvmux.policies.selection import Ask, Contribution


class Last:
    """The last child with an offer loads all of it."""

    name = "last"

    def select(
        self, ask: Ask, offset_capable: Sequence[bool], start: int, block_size: int
    ) -> list[Contribution] | None:
        """The last offer's contribution."""
        offers = [ask(i, start) for i in range(len(offset_capable))]
        if None in offers:
            return None
        found = [(i, o) for i, o in enumerate(offers) if o is not None and o.tokens]
        if not found:
            return []
        i, offer = found[-1]
        return [Contribution(i, start, offer.tokens, offer.is_async)]
