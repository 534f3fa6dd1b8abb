"""What MuxConnector's scheduler side tells its worker side each step (besides children's own)."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["EMPTY_STEP", "MuxStepPlan"]

# what a plan holds until something goes in: shared, never changed (writes replace them)
_NO_BLOCKS: list[int] = []
_NO_REQUESTS: dict[str, set[int]] = {}
_NO_CHILDREN: set[int] = set()
_NO_FAILED_LOADS: set[str] = set()


class MuxStepPlan:
    """Load ownership and finish expectations of one step.

    Most steps hold nothing, or only loads, so each container but ``load_blocks`` is made
    when the first thing goes in: read the attributes, fill them through the methods (and
    ``load_blocks`` directly).
    """

    __slots__ = (
        "async_loaders",
        "async_savers",
        "cut_off",
        "failed_blocks",
        "failed_loads",
        "load_blocks",
    )

    def __init__(self) -> None:
        # child -> blocks it loads; None: the child's own metadata names them (a kvmux tier)
        self.load_blocks: dict[int, list[int] | None] = {}
        self.failed_blocks = _NO_BLOCKS  # blocks whose loader already failed
        self.async_loaders = _NO_REQUESTS  # req -> children loading it
        self.async_savers = _NO_REQUESTS  # req -> children saving it
        self.cut_off = _NO_CHILDREN  # children that neither load nor save
        self.failed_loads = _NO_FAILED_LOADS  # async requests that lost a loader

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"MuxStepPlan({fields})"

    def add_failed(self, blocks: Iterable[int]) -> None:
        """``blocks`` will not be loaded: their loader already failed."""
        if self.failed_blocks is _NO_BLOCKS:
            self.failed_blocks = []
        self.failed_blocks.extend(blocks)

    def fail_load(self, req_id: str) -> None:
        """The asynchronous load of ``req_id`` lost a loader: the request's load failed."""
        if self.failed_loads is _NO_FAILED_LOADS:
            self.failed_loads = set()
        self.failed_loads.add(req_id)

    def expect_loaders(self, req_id: str, children: set[int]) -> None:
        """``req_id`` finishes receiving once every one of ``children`` (maybe none) reported."""
        if self.async_loaders is _NO_REQUESTS:
            self.async_loaders = {}
        self.async_loaders[req_id] = children

    def expect_savers(self, req_id: str, children: set[int]) -> None:
        """``req_id`` finishes sending once every one of ``children`` reported."""
        if self.async_savers is _NO_REQUESTS:
            self.async_savers = {}
        self.async_savers[req_id] = children

    def fail_child(self, child: int) -> None:
        """The child neither loads nor saves this step: its blocks are load errors."""
        if self.cut_off is _NO_CHILDREN:
            self.cut_off = set()
        self.cut_off.add(child)
        if child in self.load_blocks:  # the scheduler has read the ids of a None by now
            self.add_failed(self.load_blocks.pop(child) or ())
        for req_id, loaders in self.async_loaders.items():
            if child in loaders:
                loaders.discard(child)
                self.fail_load(req_id)


EMPTY_STEP = MuxStepPlan()  # a step with nothing in it; never changed (the workers only read)
