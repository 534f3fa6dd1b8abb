"""``kvmux check-config``: validate a ``--kv-transfer-config`` offline, before vLLM starts."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kvmux.config import (
    INHERITED,
    DiskSpec,
    MemorySpec,
    RedisSpec,
    StoreSpec,
    parse_mux_config,
    parse_store_connector_config,
)
from kvmux.errors import ConfigError

__all__ = ["check_config"]

CONNECTORS = ("StoreConnector", "MuxConnector")
MODULE = "kvmux.vllm"


def _spec_line(spec: StoreSpec) -> str:
    if isinstance(spec, MemorySpec):
        where = f"{spec.capacity} bytes of host memory"
    elif isinstance(spec, DiskSpec):
        cached = ", written around the page cache (O_DIRECT)" if spec.direct_writes else ""
        where = f"{spec.path}, {spec.capacity} bytes{cached}"
    elif isinstance(spec, RedisSpec):
        where = f"{spec.url.split('@')[-1]}{' (cluster)' if spec.cluster else ''}"
    signed = ", signed" if spec.signing is not None else ""
    replies = "" if spec.offload_prompt_only else ", generated blocks saved too"
    return f"{type(spec).__name__[:-4].lower()} tier {spec.name!r}: {where}{signed}{replies}"


def _parse_json(text: str) -> Mapping[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError("kv-transfer-config", f"not valid JSON: {exc}") from exc
    if not isinstance(data, Mapping):
        raise ConfigError("kv-transfer-config", "expected a JSON object")
    return data


def _is_kvmux(fields: Mapping[str, Any], name: str) -> bool:
    """Whether ``fields`` name kvmux's ``name``: by module path, or by the name alone,
    which kvmux's vLLM plugin registers."""
    return fields.get("kv_connector") == name and _kvmux_path(fields)


def _kvmux_path(fields: Mapping[str, Any]) -> bool:
    return fields.get("kv_connector_module_path") in (None, MODULE)


def check_config(text: str) -> list[str]:
    """What the config sets up, one line per connector; raises ConfigError on any mistake.

    Other vLLM connectors under MuxConnector are named, not loaded (that needs vLLM).
    """
    data = _parse_json(text)
    name = data.get("kv_connector")
    if name not in CONNECTORS:
        raise ConfigError("kv_connector", f"{name!r} is not a kvmux connector", CONNECTORS)
    if not _kvmux_path(data):
        raise ConfigError(
            "kv_connector_module_path", "must name kvmux's adapter, or be left out", MODULE
        )
    extra = data.get("kv_connector_extra_config") or {}
    if name == "StoreConnector":
        return [f"StoreConnector over the {_spec_line(parse_store_connector_config(extra).store)}"]
    mux = parse_mux_config(extra, {key: data.get(key) for key in INHERITED})
    lines = [f"MuxConnector, policy {mux.policy!r}, {len(mux.children)} children:"]
    for child in mux.children:
        if _is_kvmux(child.fields, "StoreConnector"):
            store = parse_store_connector_config(child.fields.get("kv_connector_extra_config"))
            lines.append(f"  {child.label}: {_spec_line(store.store)}")
        else:
            lines.append(f"  {child.label}: vLLM connector {child.fields['kv_connector']!r}")
    return lines
