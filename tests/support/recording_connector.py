"""vLLM's ExampleConnector, recording each hook its parent connector calls, one file a side.

``RecordingExampleConnector`` is what vLLM's tests call ``TestExampleConnector``: a real
ExampleConnector (it saves to and loads from ``shared_storage_path``) that appends one
line per hook call to ``<events_dir>/<name>-<ROLE>.log``. Files work across processes,
so a test can read what the children did inside an engine. Its extra config keys, beside
ExampleConnector's own:

    name        names the file (required)
    events_dir  the directory of the files (required)

A line is the hook's name, then each integer argument, and for KVCacheBlocks
``num_blocks=[n, ...]`` (blocks per KV cache group), e.g.
``update_state_after_alloc num_blocks=[6] 640``. Only calls from outside are recorded:
what ExampleConnector calls on itself inside a hook is not.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnector
from vllm.v1.core.kv_cache_manager import KVCacheBlocks

__all__ = [
    "POLLING_HOOKS",
    "RecordingExampleConnector",
    "from_new_request",
    "read_events",
    "without_polling",
]

MODULE = __name__  # kv_connector_module_path of the recording children

# hooks the engine calls every step whatever happens; not state transitions
POLLING_HOOKS = frozenset({"get_kv_connector_stats", "has_pending_push_work", "take_events"})


def _describe(name: str, args: tuple[Any, ...]) -> str:
    parts = [name]
    for arg in args:
        if isinstance(arg, int):
            parts.append(str(arg))
        elif isinstance(arg, KVCacheBlocks):
            parts.append(f"num_blocks={[len(group) for group in arg.blocks]}")
    return " ".join(parts)


class RecordingExampleConnector(ExampleConnector):
    """ExampleConnector that writes every hook call it receives to its events file."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any):
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config
        self._events = Path(extra["events_dir"]) / f"{extra['name']}-{role.name}.log"
        self._events.parent.mkdir(parents=True, exist_ok=True)
        self._events.write_text("")
        self._depth = 1  # > 0 while inside a recorded hook (or the constructor)
        super().__init__(vllm_config, role, kv_cache_config)
        self._depth = 0

    def _call(self, name: str, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self._depth == 0:
            with self._events.open("a") as out:
                out.write(_describe(name, args) + "\n")
        self._depth += 1
        try:
            return method(self, *args, **kwargs)
        finally:
            self._depth -= 1


def _recorded(name: str) -> Callable[..., Any]:
    inherited = getattr(ExampleConnector, name)

    def hook(self: RecordingExampleConnector, *args: Any, **kwargs: Any) -> Any:
        return self._call(name, inherited, *args, **kwargs)

    hook.__name__ = name
    hook.__doc__ = f"Record the call, then ExampleConnector.{name}."
    return hook


def _instance_hooks() -> list[str]:
    """Public instance methods of KVConnectorBase_V1 (no properties or class methods)."""
    return [
        name
        for name, value in vars(KVConnectorBase_V1).items()
        if not name.startswith("_") and inspect.isfunction(value)
    ]


for _name in _instance_hooks():
    setattr(RecordingExampleConnector, _name, _recorded(_name))


def read_events(events_dir: Path) -> dict[str, list[str]]:
    """Every recorder's lines by ``<name>-<ROLE>``; the files are emptied after reading."""
    events: dict[str, list[str]] = {}
    for path in sorted(events_dir.glob("*.log")):
        events[path.stem] = [line.strip() for line in path.read_text().splitlines() if line]
        path.write_text("")
    return events


def without_polling(events: list[str]) -> list[str]:
    """The events without the hooks polled every step."""
    return [e for e in events if e not in POLLING_HOOKS]


def from_new_request(events: list[str]) -> list[str]:
    """The events from the first ``on_new_request`` on (all of them if there is none).

    A step left over from the previous generate (its last, idle build_connector_meta)
    can land before the new request's first event.
    """
    return events[events.index("on_new_request") :] if "on_new_request" in events else events
