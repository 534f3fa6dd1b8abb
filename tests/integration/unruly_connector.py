"""A vLLM connector that reports transfers it does not owe, as some real connectors do.

vLLM's scheduler asserts on finish reports for requests it does not know, or that are
not finished (its issues #51786 and #53049): forwarded by MuxConnector, any of these
would crash the engine. Extra config:

    {"mode": "stray"}   offers nothing, yet reports every request it sees as finished
                        loading and saving, twice each
    {"mode": "slow"}    offers every full prompt block of a new request as an
                        asynchronous load (once per request), "loads" nothing, and after
                        ``delay`` steps reports the load finished with every block failed
                        (so vLLM recomputes them), then once more (unless "repeat": false)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)


@dataclass
class UnrulyMetadata(KVConnectorMetadata):
    """Requests seen this step, and new asynchronous loads with their block ids."""

    seen: set[str] = field(default_factory=set)
    loads: dict[str, list[int]] = field(default_factory=dict)


class UnrulyConnector(KVConnectorBase_V1):
    """See the module docstring."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = dict(self._kv_transfer_config.kv_connector_extra_config or {})
        self.mode = str(extra.get("mode", "stray"))
        self.delay = int(extra.get("delay", 3))
        self.repeat = bool(extra.get("repeat", True))  # report each finish a second time
        self.block_size = int(vllm_config.cache_config.block_size)
        self._seen: set[str] = set()  # scheduler: requests seen since the last metadata
        self._offered: set[str] = set()
        self._loads: dict[str, list[int]] = {}
        self._pending: dict[str, tuple[int, list[int]]] = {}  # worker: steps left, blocks
        self._repeat: list[tuple[set[str], set[str]]] = []  # reports to send again
        self._errors: set[int] = set()

    # -- scheduler side
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Any:
        """In "slow" mode: every full block below the last token, asynchronously."""
        self._seen.add(request.request_id)
        if self.mode != "slow" or num_computed_tokens or request.request_id in self._offered:
            return 0, False  # offered once: after the failure vLLM recomputes
        self._offered.add(request.request_id)
        blocks = (len(request.prompt_token_ids) - 1) // self.block_size
        return (blocks * self.block_size, True) if blocks else (0, False)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        """Note the blocks of an asynchronous load."""
        if num_external_tokens > 0:
            count = num_external_tokens // self.block_size
            self._loads[request.request_id] = list(blocks.get_block_ids()[0][:count])

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        """What this step saw and started."""
        seen = self._seen | set(scheduler_output.num_scheduled_tokens)
        meta = UnrulyMetadata(seen=seen, loads=self._loads)
        self._seen, self._loads = set(), {}
        return meta

    # -- worker side
    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        """Start nothing but a countdown per asynchronous load."""
        meta = self._get_connector_metadata()
        assert isinstance(meta, UnrulyMetadata)
        for req_id, block_ids in meta.loads.items():
            self._pending[req_id] = (self.delay, block_ids)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Nothing to wait for."""

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kw: Any) -> None:
        """Saves nothing."""

    def wait_for_save(self) -> None:
        """Saves nothing."""

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        """Reports it does not owe (stray), or late and twice (slow)."""
        sending: set[str] = set()
        recving: set[str] = set()
        for again_sending, again_recving in self._repeat:
            sending |= again_sending
            recving |= again_recving
        self._repeat = []
        if self.mode == "stray" and self.has_connector_metadata():
            meta = self._get_connector_metadata()
            assert isinstance(meta, UnrulyMetadata)
            now = set(meta.seen) | set(finished_req_ids)
            sending |= now
            recving |= now
            self._repeat.append((set(now), set(now)))
        for req_id, (left, block_ids) in list(self._pending.items()):
            if left > 1:
                self._pending[req_id] = (left - 1, block_ids)
                continue
            del self._pending[req_id]
            recving.add(req_id)
            self._errors.update(block_ids)
            if self.repeat:
                self._repeat.append((set(), {req_id}))
        return sending or None, recving or None

    def get_block_ids_with_load_errors(self) -> set[int]:
        """Every block of a finished "load": vLLM recomputes them."""
        errors, self._errors = self._errors, set()
        return errors
