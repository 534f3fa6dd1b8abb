"""The vLLM adapter: the only part of kvmux that imports vLLM.

Load a connector by name (kvmux's vLLM plugin registers both; ``kvmux.vllm.plugin``), or
with ``kv_connector_module_path="kvmux.vllm"``, and
``kv_connector="StoreConnector"`` or ``kv_connector="MuxConnector"``.
"""

from kvmux.vllm.logs import adopt_vllm_logging
from kvmux.vllm.mux_connector import MuxConnector
from kvmux.vllm.store_connector import StoreConnector

adopt_vllm_logging()  # loaded in every engine process that builds a connector

__all__ = ["MuxConnector", "StoreConnector"]
