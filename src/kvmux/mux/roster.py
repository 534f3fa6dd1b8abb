"""The mux's children, built once: each with its guard, label and stats path (pure Python).

Every view the two halves of MuxConnector need (whose hooks to call, which children
publish events, which read their own worker metadata) derives from the one ``Roster``,
and ``fan_out`` is the one guarded call of a hook on children.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from kvmux.mux.capabilities import Capabilities, capabilities_of
from kvmux.mux.guard import ChildGuard, Notices
from kvmux.policies.breaker import CircuitBreaker

__all__ = ["Member", "Roster"]


@dataclass(frozen=True, slots=True)
class Member:
    """One child: its place in load order, the connector, its guard, what stats call it."""

    index: int
    connector: Any
    guard: ChildGuard
    path: str  # the connector's class, as stats name it
    hma: bool = False  # handles several KV cache groups (vLLM's SupportsHMA)

    @property
    def label(self) -> str:
        """The child's name in logs, stats and metrics."""
        return self.guard.label


class Roster:
    """The children in load order, and the hooks each of them may act on.

    ``no_op_hooks`` are hooks whose base implementation (``no_op_base``, vLLM's
    ``KVConnectorBase_V1``) does nothing and returns a constant: a child that does not
    override one is not called for it (``listening``).
    """

    def __init__(
        self,
        children: Iterable[tuple[str, Any, str, bool]],
        breaker: Callable[[], CircuitBreaker],
        no_op_base: type | None = None,
        no_op_hooks: Sequence[str] = (),
    ):
        self.notices = Notices()  # something to report at once, from any child's guard
        self.members = tuple(
            Member(i, connector, ChildGuard(label, breaker(), self.notices), path, hma)
            for i, (label, connector, path, hma) in enumerate(children)
        )
        self.connectors = [m.connector for m in self.members]
        self.guards = [m.guard for m in self.members]
        self._listening = {
            hook: tuple(m for m in self.members if _may_act(m.connector, hook, no_op_base))
            for hook in no_op_hooks
        }

    def capabilities(self) -> list[Capabilities]:
        """Each child's capabilities now (``mux/capabilities.py``)."""
        return [capabilities_of(c) for c in self.connectors]

    def listening(self, hook: str) -> tuple[Member, ...]:
        """The children that may act on ``hook`` (all, unless it is a no-op hook)."""
        return self._listening.get(hook, self.members)

    def fan_out(
        self,
        hook: str,
        *args: Any,
        default: Any = None,
        members: Sequence[Member] | None = None,
    ) -> list[Any]:
        """``child.<hook>(*args)`` of every child (of ``members``, else of those
        ``listening``), each guarded: a child that raises is counted, logged, its breaker
        opened, and gives ``default``. Runs even past an open breaker: lifecycle and
        bookkeeping hooks are never skipped."""
        results = []
        for member in self.listening(hook) if members is None else members:
            try:
                results.append(getattr(member.connector, hook)(*args))
            except Exception as exc:
                member.guard.fail(hook, exc)
                results.append(default)
        return results

    def fan_out_call(self, hook: str, call: Callable[[Any], Any], default: Any = None) -> list[Any]:
        """``call(child)`` for every child, guarded as ``fan_out`` (for properties)."""
        return [
            m.guard.invoke(hook, call, (m.connector,), default, always=True) for m in self.members
        ]

    def first_not_none(self, hook: str, *args: Any) -> Any:
        """The first child's answer to ``hook`` that is not None (guarded)."""
        return next((found for found in self.fan_out(hook, *args) if found is not None), None)


def _may_act(connector: Any, hook: str, base: type | None) -> bool:
    """Whether ``connector`` may do something in ``hook``: its class overrides the base
    class's no-op, the instance has its own, or the class intercepts every attribute
    (a ``__getattribute__`` wrapper, as vLLM's own MultiConnector tests record calls)."""
    if base is None:
        return True
    cls = type(connector)
    if getattr(cls, hook, None) is not getattr(base, hook) or hook in getattr(
        connector, "__dict__", {}
    ):
        return True
    intercepts: Any = cls.__getattribute__
    return intercepts is not object.__getattribute__
