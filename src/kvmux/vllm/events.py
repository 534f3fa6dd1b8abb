"""vLLM KV cache events for the blocks one tier holds, for KV-aware routers.

A tier announces each block it is given with vLLM's ``BlockStored`` and each block it
loses with ``BlockRemoved``, under vLLM's own block hash of the request's block
(``request.block_hashes``, the hash the GPU prefix cache's events carry), so a router
can match a prompt against every tier of every engine.

What the scheduler knows is what it announces: a block is stored when its save is
planned (the scheduler then offers it to later requests) and removed when the memory
tier evicts it, when the workers report a save dropped or failed or a load that found
the block gone, and on a reset. Disk and Redis evict on their own: those removals are
seen only when a load misses.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from itertools import groupby
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_events import (
    MEDIUM_CPU,
    MEDIUM_STORAGE,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
)
from vllm.v1.core.kv_cache_utils import (
    BlockHashList,
    ExternalBlockHash,
    generate_block_hash_extra_keys,
    maybe_convert_block_hash,
    resolve_block_hashes,
    to_event_extra_keys,
)

from kvmux.config import MemorySpec, RedisSpec, StoreSpec
from kvmux.keys import BlockKey
from kvmux.tier.scheduler.plan import SavedBlock

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.request import Request

__all__ = ["MAX_EVENTS", "MAX_TRACKED_BLOCKS", "TierEvents", "events_enabled", "medium_of"]

log = logging.getLogger(__name__)
MAX_EVENTS = 10_000  # events kept until take_events; past it the oldest are dropped
MAX_TRACKED_BLOCKS = 1 << 16  # announced blocks remembered for BlockRemoved (disk, Redis)


def events_enabled(vllm_config: VllmConfig) -> bool:
    """Whether the engine publishes KV cache events (``kv_events_config``)."""
    config = getattr(vllm_config, "kv_events_config", None)  # absent from partial configs
    return config is not None and bool(config.enable_kv_cache_events)


def medium_of(spec: StoreSpec) -> tuple[str, str]:
    """The tier's (medium, locality) in events: vLLM's names for its offloading tiers.

    Memory is ``CPU`` (vLLM's CPU offloading tier), disk and Redis are ``STORAGE``;
    locality tells Redis (``REMOTE``, shared by every engine using it) from the rest.
    """
    if isinstance(spec, MemorySpec):
        return MEDIUM_CPU, "LOCAL"
    if isinstance(spec, RedisSpec):
        return MEDIUM_STORAGE, "REMOTE"
    return MEDIUM_STORAGE, "LOCAL"


class TierEvents:
    """The tier's pending KV cache events, and the blocks it announced (to remove them)."""

    def __init__(
        self,
        spec: StoreSpec,
        block_size: int,
        hash_block_size: int | None = None,
        max_tracked: int = MAX_TRACKED_BLOCKS,
    ):
        self.medium, self.locality = medium_of(spec)
        self.ownership = spec.name  # the tier's name: tells several tiers apart
        self._block_size = block_size
        self._hash_block_size = hash_block_size or block_size
        self._max_tracked = max_tracked
        self._events: deque[KVCacheEvent] = deque(maxlen=MAX_EVENTS)
        self._held: OrderedDict[BlockKey, tuple[ExternalBlockHash, int]] = OrderedDict()
        self._requests: dict[str, Request] = {}
        self.dropped = 0  # events dropped because nobody took them
        self.failed = 0  # runs of saved blocks whose event could not be built

    def watch(self, request: Request) -> None:
        """Keep the request until it finishes: its hashes and tokens describe its saves."""
        self._requests[request.request_id] = request

    def finish(self, req_id: str) -> None:
        """The request finished: no save of it is announced after."""
        self._requests.pop(req_id, None)

    def stored(self, saved: Sequence[SavedBlock]) -> None:
        """Announce the blocks a plan saves (a block already announced is not again)."""
        ordered = sorted(saved, key=lambda b: (b.req_id, b.group, b.position))
        for (req_id, group), blocks in groupby(ordered, lambda b: (b.req_id, b.group)):
            request = self._requests.get(req_id)
            if request is None:
                continue
            try:
                self._stored_run(request, group, [b for b in blocks if self._fresh(b.key)])
            except Exception as exc:  # events inform routers: never stop the engine
                self.failed += 1
                if self.failed == 1:
                    log.warning("kvmux tier %s: KV event not built: %r", self.ownership, exc)

    def _fresh(self, key: BlockKey) -> bool:
        if key in self._held:
            self._held.move_to_end(key)
            return False
        return True

    def _stored_run(self, request: Request, group: int, blocks: list[SavedBlock]) -> None:
        """One BlockStored per run of consecutive positions, as vLLM's block pool does."""
        hashes = resolve_block_hashes(request.block_hashes, self._hash_block_size, self._block_size)
        blocks = [b for b in blocks if b.position < len(hashes)]  # unhashed: not announced
        run: list[SavedBlock] = []
        for block in blocks:
            if run and block.position != run[-1].position + 1:
                self._emit_stored(request, group, run, hashes)
                run = []
            run.append(block)
        if run:
            self._emit_stored(request, group, run, hashes)

    def _emit_stored(
        self, request: Request, group: int, run: list[SavedBlock], hashes: BlockHashList
    ) -> None:
        first, end = run[0].position, run[-1].position + 1
        size = self._block_size
        block_hashes = [maybe_convert_block_hash(hashes[i]) for i in range(first, end)]
        for block, block_hash in zip(run, block_hashes, strict=True):
            self._track(block.key, block_hash, group)
        lora = request.lora_request
        self._push(
            BlockStored(
                block_hashes=block_hashes,
                parent_block_hash=maybe_convert_block_hash(hashes[first - 1]) if first else None,
                token_ids=list(request.all_token_ids[first * size : end * size]),
                block_size=size,
                lora_id=lora.adapter_id if lora else None,
                medium=self.medium,
                lora_name=lora.name if lora else None,
                extra_keys=to_event_extra_keys(_extra_keys(request, first, end, size)),
                group_idx=group,
                locality=self.locality,
                ownership=self.ownership,
                session_id=request.session_id,
            )
        )

    def _track(self, key: BlockKey, block_hash: ExternalBlockHash, group: int) -> None:
        self._held[key] = (block_hash, group)
        while len(self._held) > self._max_tracked:  # forgotten: its removal goes unseen
            self._held.popitem(last=False)

    def removed(self, keys: Iterable[BlockKey]) -> None:
        """Announce the removal of those of ``keys`` the tier announced."""
        by_group: dict[int, list[ExternalBlockHash]] = {}
        for key in keys:
            held = self._held.pop(key, None)
            if held is not None:
                by_group.setdefault(held[1], []).append(held[0])
        for group, block_hashes in by_group.items():
            self._push(
                BlockRemoved(
                    block_hashes=block_hashes,
                    medium=self.medium,
                    group_idx=group,
                    locality=self.locality,
                    ownership=self.ownership,
                )
            )

    def cleared(self) -> None:
        """The tier serves nothing stored before (a reset): remove every announced block."""
        self.removed(list(self._held))

    def _push(self, event: KVCacheEvent) -> None:
        if len(self._events) == self._events.maxlen:
            self.dropped += 1
            if self.dropped == 1:
                log.warning("kvmux tier %s: KV events not taken, dropping", self.ownership)
        self._events.append(event)

    def take(self) -> list[KVCacheEvent]:
        """The events since the last call, oldest first."""
        events = list(self._events)
        self._events.clear()
        return events


def _extra_keys(request: Request, first: int, end: int, size: int) -> list[tuple[Any, ...] | None]:
    """Each block's extra keys (LoRA, multimodal items, salt), as vLLM's own events carry."""
    keys: list[tuple[Any, ...] | None] = []
    mm_index = 0
    for position in range(first, end):
        extra, mm_index = generate_block_hash_extra_keys(
            request, position * size, (position + 1) * size, mm_index
        )
        keys.append(extra)
    return keys
