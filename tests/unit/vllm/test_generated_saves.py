"""StoreConnector saves a request's generated blocks when the tier or the request asks."""

from __future__ import annotations

from typing import Any

import pytest

from kvmux.keys import block_keys
from kvmux.vllm.store_connector import StoreConnector
from tests.unit.vllm.test_store_connector import BLOCK, MEMORY, _step, fake_request, scheduler

PROMPT = 2 * BLOCK + 4
GENERATED = list(range(5000, 5000 + 2 * BLOCK))


def _decode(connector: StoreConnector, params: dict[str, Any] | None) -> list[bytes]:
    """Prefill, then decode a block and a half; every key the steps save."""
    request = fake_request("r", PROMPT, kv_transfer_params=params)
    request.all_token_ids = list(request.prompt_token_ids)
    connector.get_num_new_matched_tokens(request, 0)  # type: ignore[arg-type]
    blocks = list(range(1, 9))
    saved = list(connector.build_connector_meta(_step("r", 0, PROMPT, blocks)).plan.saves)  # type: ignore[arg-type, attr-defined]
    for token in GENERATED[: 3 * BLOCK // 2]:
        request.all_token_ids.append(token)
        computed = len(request.all_token_ids) - 1
        output = _step("r", computed, 1, blocks)
        saved += connector.build_connector_meta(output).plan.saves  # type: ignore[arg-type, attr-defined]
    connector.request_finished(request, blocks)  # type: ignore[arg-type]
    return [t.key for t in saved]


def _all_keys(connector: StoreConnector) -> list[bytes]:
    tokens = list(range(1, PROMPT + 1)) + GENERATED
    return list(block_keys(connector._namespace, tokens, BLOCK))


@pytest.mark.parametrize(
    ("store", "params", "blocks"),
    [
        (MEMORY, None, 2),
        (MEMORY, {"offload_prompt_only": False}, 3),
        ({**MEMORY, "offload_prompt_only": False}, None, 3),
        ({**MEMORY, "offload_prompt_only": False}, {"offload_prompt_only": True}, 2),
    ],
)
def test_the_request_overrides_the_tier(
    store: dict[str, Any], params: dict[str, Any] | None, blocks: int
) -> None:
    connector = scheduler(store)
    assert _decode(connector, params) == _all_keys(connector)[:blocks]
    assert connector.sched is not None
    assert connector.sched._generating == {}  # forgotten once finished
