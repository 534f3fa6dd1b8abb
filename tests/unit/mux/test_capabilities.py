"""kvmux.mux.capabilities: one typed contract between MuxConnector and its children."""

from __future__ import annotations

from kvmux.mux.capabilities import FOREIGN, Capabilities, SupportsMux, capabilities_of


class Foreign:
    """Any vLLM connector: it states nothing."""


class Tier:
    def __init__(self, capabilities: Capabilities):
        self.capabilities = capabilities

    def mux_capabilities(self) -> Capabilities:
        return self.capabilities


def test_a_connector_that_states_nothing_gets_multiconnectors_assumptions() -> None:
    assert capabilities_of(Foreign()) is FOREIGN
    assert FOREIGN.layer_loads and FOREIGN.saves_layers and FOREIGN.publishes_events
    assert not (FOREIGN.offset_loads or FOREIGN.agrees_across_ranks or FOREIGN.drops_saves)


def test_a_tier_states_its_own_and_layer_saves_follow_layer_loads_unless_said() -> None:
    whole_steps = Tier(Capabilities(offset_loads=True, layer_loads=False))
    assert isinstance(whole_steps, SupportsMux)
    assert capabilities_of(whole_steps).offset_loads
    assert not capabilities_of(whole_steps).saves_layers
    loads_by_layer = Capabilities(layer_loads=True, layer_saves=False)
    assert not loads_by_layer.saves_layers


def test_store_connector_states_its_capabilities() -> None:
    from kvmux.vllm import StoreConnector

    assert issubclass(StoreConnector, SupportsMux)
    for name in ("mux_join_agreement", "mux_load_blocks", "mux_drop_saves_over"):
        assert callable(getattr(StoreConnector, name))
