"""What a child tells MuxConnector beyond vLLM's connector API: one typed contract (pure Python).

vLLM's own pattern for this is ``SupportsHMA`` and ``supports_hma()``: a connector that
implements ``SupportsMux`` returns its ``Capabilities``; any other connector gets
``FOREIGN``, the assumptions vLLM's MultiConnector makes about every child. A kvmux tier
uses them to let the mux skip work it does not need (per-layer hooks of a tier that
copies whole steps, an ``update_connector_output`` without its metadata) and to coordinate
what a foreign child cannot (loads agreed across tensor-parallel ranks, saves dropped
over a sibling's failed load).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = ["FOREIGN", "Capabilities", "SupportsMux", "capabilities_of"]


@dataclass(frozen=True)
class Capabilities:
    """A child's answers; the defaults are a foreign connector's."""

    offset_loads: bool = False  # can load a range that starts past the computed tokens
    layer_loads: bool = True  # wait_for_layer_load does work
    layer_saves: bool | None = None  # save_kv_layer does work (None: as layer_loads)
    layer_work_by_step: bool = False  # has_connector_metadata tells, per step, if they do
    output_needs_meta: bool = False  # update_connector_output acts on its own metadata only
    publishes_events: bool = True  # take_events may return something
    agrees_across_ranks: bool = False  # start_load_kv runs a collective over TP ranks
    names_load_blocks: bool = False  # mux_load_blocks(meta) names the blocks meta loads
    drops_saves: bool = False  # mux_drop_saves_over(ids) skips saves over failed loads

    @property
    def saves_layers(self) -> bool:
        """Whether save_kv_layer does work."""
        return self.layer_loads if self.layer_saves is None else self.layer_saves


FOREIGN = Capabilities()


@runtime_checkable
class SupportsMux(Protocol):
    """A connector that states its capabilities (a kvmux tier).

    With ``agrees_across_ranks`` it has ``mux_join_agreement(meta)``; with
    ``names_load_blocks``, ``mux_load_blocks(meta) -> list[int]``; with ``drops_saves``,
    ``mux_drop_saves_over(block_ids)``.
    """

    def mux_capabilities(self) -> Capabilities:
        """This connector's capabilities now (some are known once it adopted the KV cache)."""


def capabilities_of(child: Any) -> Capabilities:
    """``child``'s capabilities: its own if it states them, else ``FOREIGN``."""
    if isinstance(child, SupportsMux):
        return child.mux_capabilities()
    return FOREIGN
