"""kvmux: never compute the same KV cache twice.

The vLLM connectors live in :mod:`kvmux.vllm` (imported lazily, as it needs vLLM).
"""

from kvmux.config import (
    DiskSpec,
    MemorySpec,
    StoreConnectorConfig,
    parse_capacity,
    parse_store_connector_config,
    parse_store_spec,
)
from kvmux.errors import ConfigError, CorruptEntry, KvmuxError, StoreError, StoreUnavailable
from kvmux.metrics import TierStats
from kvmux.stores import DictStore, DiskStore, KVStore, open_store

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "CorruptEntry",
    "DictStore",
    "DiskSpec",
    "DiskStore",
    "KVStore",
    "KvmuxError",
    "MemorySpec",
    "StoreConnectorConfig",
    "StoreError",
    "StoreUnavailable",
    "TierStats",
    "__version__",
    "open_store",
    "parse_capacity",
    "parse_store_connector_config",
    "parse_store_spec",
]
