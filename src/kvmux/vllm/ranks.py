"""Agreement across tensor-parallel ranks on which of a step's loads landed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from kvmux.tier.worker.base import RankAgreement

if TYPE_CHECKING:
    from vllm.config import VllmConfig

__all__ = ["rank_agreement"]


def rank_agreement(vllm_config: VllmConfig) -> RankAgreement | None:
    """A collective over the tensor-parallel group (its CPU group), None without one.

    Called by every rank on each step with synchronous loads, with one flag per load in
    the plan's order (the plan is the same on every rank): a load landed only if it
    landed on every rank.
    """
    if int(vllm_config.parallel_config.tensor_parallel_size) <= 1:
        return None

    def landed_on_every_rank(landed: Sequence[bool]) -> list[bool]:
        import torch.distributed as dist
        from vllm.distributed.parallel_state import get_tp_group

        failed = torch.tensor([0 if ok else 1 for ok in landed], dtype=torch.int32)
        dist.all_reduce(failed, op=dist.ReduceOp.MAX, group=get_tp_group().cpu_group)
        return [flag == 0 for flag in failed.tolist()]

    return landed_on_every_rank
