"""The public names are exactly the documented ones."""

from __future__ import annotations

import kvmux


def test_top_level_public_names() -> None:
    assert sorted(kvmux.__all__) == sorted(
        [
            "ConfigError",
            "CorruptEntry",
            "DiskSpec",
            "DiskStore",
            "KVStore",
            "KvmuxError",
            "MemorySpec",
            "DictStore",
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
    )
    assert all(hasattr(kvmux, name) for name in kvmux.__all__)


def test_vllm_adapter_exports_both_connectors() -> None:
    import kvmux.vllm

    assert kvmux.vllm.__all__ == ["MuxConnector", "StoreConnector"]
