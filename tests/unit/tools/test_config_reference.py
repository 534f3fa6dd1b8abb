"""docs/configuration-reference.md: generated from the parser, and naming every key it takes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvmux import config
from kvmux.tools.config_reference import DEFAULT_OUT, accepted_keys, main, render

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / DEFAULT_OUT


def _keys_in(text: str, heading: str) -> set[str]:
    """The keys of the tables under one heading, up to the next heading of its level."""
    level = heading.split(" ")[0]
    section = text.split(f"\n{heading}\n", 1)[1]
    section = re.split(rf"\n#{{1,{len(level)}}} ", section, maxsplit=1)[0]
    return set(re.findall(r"^\| `([^`]+)` \|", section, flags=re.M))


def test_the_committed_page_is_what_the_generator_writes() -> None:
    assert PAGE.read_text() == render(), "run: python -m kvmux.tools.config_reference"


def test_every_key_the_parser_accepts_is_on_the_page() -> None:
    # Straight from the parser's own sets of keys it validates against (not from the
    # generator's probes), and the dataclass fields a key sets.
    text = PAGE.read_text()
    store_level = _keys_in(text, "## Store specs")
    for kind, keys in config._STORE_KEYS.items():
        assert keys <= store_level, kind
        assert f"### `{kind}`" in text
    assert _keys_in(text, "### `signing`") >= config._SIGNING_KEYS
    assert _keys_in(text, "## StoreConnector") >= config._CONNECTOR_KEYS
    assert _keys_in(text, "## MuxConnector") >= config._MUX_KEYS
    fields = {
        f
        for spec in (config.MemorySpec, config.DiskSpec, config.RedisSpec)
        for f in spec.__dataclass_fields__
    }
    assert fields <= store_level
    for choice in (*config.ASYNC_LOADS, *config.POLICIES, *config.INHERITED):
        assert f"`{choice}`" in text


def test_the_generator_reads_the_same_keys_the_parser_checks() -> None:
    levels = accepted_keys()
    assert {k: levels[k] for k in config._STORE_KEYS} == config._STORE_KEYS
    assert levels["signing"] == config._SIGNING_KEYS
    assert levels["StoreConnector"] == config._CONNECTOR_KEYS
    assert levels["MuxConnector"] == config._MUX_KEYS


def test_check_mode_finds_a_stale_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "reference.md"
    assert main(["--check", str(out)]) == 1
    assert main([str(out)]) == 0
    assert main(["--check", str(out)]) == 0
    out.write_text(out.read_text().replace("`store`", "`stor`"))
    assert main(["--check", str(out)]) == 1
    assert "out of date" in capsys.readouterr().out
