"""kvmux check-config: a config's mistakes, found offline, named by key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvmux.cli import main

MUX = {
    "kv_connector": "MuxConnector",
    "kv_connector_module_path": "kvmux.vllm",
    "kv_role": "kv_both",
    "kv_connector_extra_config": {
        "policy": "compose",
        "tiers": [
            {"type": "memory", "capacity": "1GiB"},
            {"type": "disk", "path": "/kv", "capacity": "1GiB"},
        ],
        "connectors": [{"kv_connector": "ExampleConnector", "kv_role": "kv_both"}],
    },
}


def run(config: Any, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    text = config if isinstance(config, str) else json.dumps(config)
    status = main(["check-config", text])
    out, err = capsys.readouterr()
    return status, out, err


def test_a_good_mux_config_is_described(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(MUX, capsys)
    assert status == 0
    assert "MuxConnector, policy 'compose', 3 children:" in out
    assert "0:memory: memory tier 'memory'" in out
    assert "1:disk: disk tier 'disk': /kv" in out
    assert "2:ExampleConnector: vLLM connector 'ExampleConnector'" in out
    assert out.rstrip().endswith("config ok")


def test_a_store_connector_config(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = {
        "kv_connector": "StoreConnector",
        "kv_connector_module_path": "kvmux.vllm",
        "kv_connector_extra_config": {"store": {"type": "redis", "url": "redis://u:pw@h:6379/0"}},
    }
    status, out, _ = run(config, capsys)
    assert status == 0
    assert "redis tier 'redis': h:6379/0" in out  # the password is not printed
    assert "pw" not in out


def test_a_config_without_module_path_names_kvmux_by_its_registered_names(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """kvmux's vLLM plugin registers both names: the module path may be left out."""
    store = {"type": "memory", "capacity": "1GiB"}
    child = {"kv_connector": "StoreConnector", "kv_connector_extra_config": {"store": store}}
    config = {
        "kv_connector": "MuxConnector",
        "kv_connector_extra_config": {"connectors": [child]},
    }
    status, out, _ = run(config, capsys)
    assert status == 0
    assert "0:memory: memory tier" in out


def test_a_tier_that_saves_generated_blocks_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    store = {"type": "memory", "capacity": "1GiB", "offload_prompt_only": False}
    config = {**MUX, "kv_connector_extra_config": {"tiers": [store]}}
    status, out, _ = run(config, capsys)
    assert status == 0
    assert (
        "memory tier 'memory': 1073741824 bytes of host memory, generated blocks saved too" in out
    )


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ("{not json", "kv-transfer-config"),
        ({**MUX, "kv_connector": "LMCacheConnectorV1"}, "kv_connector"),
        ({**MUX, "kv_connector_module_path": "kvmux"}, "kv_connector_module_path"),
        ({**MUX, "kv_connector_extra_config": {"policy": "fastest", "tiers": []}}, "policy"),
        ({**MUX, "kv_connector_extra_config": {"tiers": [{"type": "tape"}]}}, "tiers[0]"),
        ({**MUX, "kv_connector_extra_config": {}}, "connectors"),
    ],
)
def test_mistakes_are_one_line_naming_the_key(
    config: Any, named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run(config, capsys)
    assert status == 1
    assert out == ""
    assert err.startswith("kvmux: ") and named in err
    assert "Traceback" not in err
