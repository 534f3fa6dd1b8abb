"""What MuxConnector's scheduler side tells its worker side each step (besides children's own)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["MuxStepPlan"]


@dataclass
class MuxStepPlan:
    """Load ownership and finish expectations of one step."""

    load_blocks: dict[int, list[int]] = field(default_factory=dict)  # child -> blocks it loads
    failed_blocks: list[int] = field(default_factory=list)  # blocks whose loader already failed
    async_loaders: dict[str, set[int]] = field(default_factory=dict)  # req -> children loading it
    async_savers: dict[str, set[int]] = field(default_factory=dict)  # req -> children saving it
    cut_off: set[int] = field(default_factory=set)  # children that neither load nor save

    def fail_child(self, child: int) -> None:
        """The child's loads this step will not happen: their blocks are load errors."""
        self.failed_blocks.extend(self.load_blocks.pop(child, []))
        for loaders in self.async_loaders.values():
            loaders.discard(child)
