"""MuxConnector calls a base no-op hook only on children that may do something in it."""

from __future__ import annotations

from typing import Any, ClassVar

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

from kvmux.mux.roster import Roster
from kvmux.policies.breaker import CircuitBreaker
from kvmux.vllm.mux_connector import BASE_NO_OPS


class Plain(KVConnectorBase_V1):  # type: ignore[misc]
    """Overrides nothing."""


class Overriding(KVConnectorBase_V1):  # type: ignore[misc]
    def on_new_request(self, request: Any) -> None:
        return None


class Intercepting(KVConnectorBase_V1):  # type: ignore[misc]
    """Records every call through ``__getattribute__``, as vLLM's MultiConnector tests do."""

    calls: ClassVar[list[str]] = []

    def __getattribute__(self, name: str) -> Any:
        attribute = object.__getattribute__(self, name)
        if callable(attribute) and not name.startswith("_"):
            Intercepting.calls.append(name)
        return attribute


for _cls in (Plain, Overriding, Intercepting):  # built without an engine: nothing abstract
    _cls.__abstractmethods__ = frozenset()


def _roster(*connectors: Any) -> Roster:
    children = [(f"{i}:child", c, "path", False) for i, c in enumerate(connectors)]
    return Roster(children, CircuitBreaker, KVConnectorBase_V1, BASE_NO_OPS)


def test_only_children_that_may_act_get_a_base_no_op_hook() -> None:
    plain, overriding, intercepting = (object.__new__(c) for c in (Plain, Overriding, Intercepting))
    own = object.__new__(Plain)
    own.on_new_request = lambda request: None  # an instance's own hook
    roster = _roster(plain, overriding, intercepting, own)
    called = [m.connector for m in roster.listening("on_new_request")]
    assert called == [overriding, intercepting, own]
    assert len(roster.listening("start_load_kv")) == 4  # not a no-op hook: every child
