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
        # child -> request it owes -> when its hold ends (see ``hold``); empty in most runs
        self._held: dict[int, dict[str, float]] = {}

    def expect(self, req_id: str, children: Iterable[int]) -> None:
        """``req_id`` is done when every child in ``children`` reported it."""
        owed = set(children)
        if owed:
            self._waiting.setdefault(req_id, set()).update(owed)

    def report(self, child: int, req_ids: Iterable[str], failed: bool = False) -> set[str]:
        """Child ``child`` finished ``req_ids``; returns the requests now complete."""
        done: set[str] = set()
        held = self._held.get(child) if self._held else None
        for req_id in req_ids:
            owed = self._waiting.get(req_id)
            if owed is None or child not in owed:
                self.ignored += 1
                continue
            owed.discard(child)
            if held:
                held.pop(req_id, None)
            if failed:
                self._failed.add(req_id)
            if not owed:
                del self._waiting[req_id]
                done.add(req_id)
        if held is not None and not held:
            del self._held[child]
        return done

    def fail(self, req_id: str) -> None:
        """``req_id`` failed, whoever finishes it: it is reported failed once complete."""
        self._failed.add(req_id)

    def hold(self, child: int, until: float, failed: bool = False) -> None:
        """What ``child`` owes now stays owed until it reports it or ``until`` passes
        (``expired``); a request already held keeps its first ``until``. With ``failed``,
        each of those requests is failed, whoever finishes it."""
        held = self._held.get(child)
        for req_id, owed in self._waiting.items():
            if child in owed and (held is None or req_id not in held):
                if held is None:
                    held = self._held[child] = {}
                held[req_id] = until
                if failed:
                    self._failed.add(req_id)

    @property
    def holding(self) -> bool:
        """Whether some child has a request on hold."""
        return bool(self._held)

    def release_expired(self, now: float) -> tuple[set[str], dict[int, int]]:
        """Held requests whose hold ended by ``now`` count as finished (and failed) by
        their child: the requests now complete, and how many each child let go."""
        done: set[str] = set()
        released: dict[int, int] = {}
        for child, held in list(self._held.items()):
            expired = [req_id for req_id, until in held.items() if until <= now]
            if expired:
                released[child] = len(expired)
                done |= self.report(child, expired, failed=True)
        return done, released

    def take_failed(self, req_ids: Iterable[str]) -> set[str]:
        """Of the completed ``req_ids``, those that some child failed."""
        failed = self._failed.intersection(req_ids)
        self._failed -= failed
        return failed
