"""Report each request's transfer finished exactly once, after all its children finished."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["FinishTracker"]


class FinishTracker:
    """Which children still owe a finish signal for which request."""

    def __init__(self) -> None:
        self._waiting: dict[str, set[int]] = {}
        self._failed: set[str] = set()
        self.ignored = 0  # signals from children that owed none (duplicates, strays)

    def expect(self, req_id: str, children: Iterable[int]) -> None:
        """``req_id`` is done when every child in ``children`` reported it."""
        owed = set(children)
        if owed:
            self._waiting.setdefault(req_id, set()).update(owed)

    def report(self, child: int, req_ids: Iterable[str], failed: bool = False) -> set[str]:
        """Child ``child`` finished ``req_ids``; returns the requests now complete."""
        done: set[str] = set()
        for req_id in req_ids:
            owed = self._waiting.get(req_id)
            if owed is None or child not in owed:
                self.ignored += 1
                continue
            owed.discard(child)
            if failed:
                self._failed.add(req_id)
            if not owed:
                del self._waiting[req_id]
                done.add(req_id)
        return done

    def fail(self, req_id: str) -> None:
        """``req_id`` failed, whoever finishes it: it is reported failed once complete."""
        self._failed.add(req_id)

    def abandon_child(self, child: int) -> set[str]:
        """A child died: what it owes counts as finished (and failed)."""
        owing = [req_id for req_id, owed in self._waiting.items() if child in owed]
        return self.report(child, owing, failed=True)

    def take_failed(self, req_ids: Iterable[str]) -> set[str]:
        """Of the completed ``req_ids``, those that some child failed."""
        failed = self._failed.intersection(req_ids)
        self._failed -= failed
        return failed
