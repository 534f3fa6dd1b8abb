"""The vLLM adapter: the only part of kvmux that imports vLLM.

Load it with ``kv_connector_module_path="kvmux.vllm"`` and
``kv_connector="StoreConnector"``.
"""

from kvmux.vllm.store_connector import StoreConnector

__all__ = ["StoreConnector"]
