"""kvmux.vllm.checkpoint: which weights, from their sampled contents."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from kvmux.errors import ConfigError
from kvmux.vllm.checkpoint import EDGE_BYTES, SAMPLE_BYTES, SAMPLES, checkpoint_identity


def _checkpoint(folder: Path, fill: bytes, size: int = 10) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text("{}")
    weights = folder / "model.safetensors"
    weights.write_bytes(fill * size)
    return weights


def test_the_identity_follows_the_weights_contents(tmp_path: Path) -> None:
    weights = _checkpoint(tmp_path / "m", b"a")
    first = checkpoint_identity(str(tmp_path / "m"), None)
    assert checkpoint_identity(str(tmp_path / "m"), None) == first
    (tmp_path / "m" / "notes.txt").write_text("not weights")
    assert checkpoint_identity(str(tmp_path / "m"), None) == first
    weights.write_bytes(b"b" * 11)  # weights rewritten in place
    assert checkpoint_identity(str(tmp_path / "m"), None) != first


def test_new_weights_copied_with_their_times_kept_get_a_new_identity(tmp_path: Path) -> None:
    old = _checkpoint(tmp_path / "old", b"a", 4096)
    _checkpoint(tmp_path / "new", b"b", 4096)
    before = checkpoint_identity(str(tmp_path / "old"), None)
    stat = old.stat()
    shutil.copy2(tmp_path / "new" / "model.safetensors", old)  # cp -p: same size, name
    os.utime(old, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # and the old times
    assert checkpoint_identity(str(tmp_path / "old"), None) != before


def test_the_identity_does_not_depend_on_where_or_when(tmp_path: Path) -> None:
    _checkpoint(tmp_path / "here", b"a", 4096)
    shutil.copytree(tmp_path / "here", tmp_path / "there")  # new times, another path
    os.utime(tmp_path / "there" / "model.safetensors", (1, 1))
    here = checkpoint_identity(str(tmp_path / "here"), None)
    assert checkpoint_identity(str(tmp_path / "there"), None) == here


def test_a_large_file_is_sampled_at_its_ends_and_between(tmp_path: Path) -> None:
    size = 2 * EDGE_BYTES + SAMPLES * SAMPLE_BYTES * 4
    weights = tmp_path / "m" / "model.safetensors"
    weights.parent.mkdir()
    with weights.open("wb") as handle:
        handle.truncate(size)  # sparse: reading it all would be slow and pointless
    first = checkpoint_identity(str(tmp_path / "m"), None)
    with weights.open("r+b") as handle:
        handle.seek(size - 1)
        handle.write(b"\x01")  # the last byte: inside the last MiB
    second = checkpoint_identity(str(tmp_path / "m"), None)
    assert second != first
    with weights.open("r+b") as handle:
        handle.seek(EDGE_BYTES + SAMPLE_BYTES // 2)  # between two sampled ranges
        handle.write(b"\x01")
    assert checkpoint_identity(str(tmp_path / "m"), None) == second  # documented limit


def test_a_single_gguf_file_is_a_checkpoint(tmp_path: Path) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF" + b"a" * 100)
    first = checkpoint_identity(str(model), None)
    assert first.startswith("contents:")
    model.write_bytes(b"GGUF" + b"b" * 100)
    assert checkpoint_identity(str(model), None) != first


def test_a_hub_model_not_in_the_cache_is_its_revision(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert checkpoint_identity("no-such-org/no-such-model", "abc123") == "revision:abc123"


def test_an_unreadable_checkpoint_is_a_config_error(tmp_path: Path) -> None:
    weights = _checkpoint(tmp_path / "m", b"a")
    weights.unlink()
    weights.mkdir()  # a directory named like weights: skipped, not an error
    assert checkpoint_identity(str(tmp_path / "m"), None).startswith("contents:")
    (tmp_path / "m" / "broken.safetensors").symlink_to(tmp_path / "nowhere")
    assert checkpoint_identity(str(tmp_path / "m"), None).startswith("contents:")
    unreadable = tmp_path / "m" / "x.bin"
    unreadable.write_bytes(b"x")
    unreadable.chmod(0)
    if os.geteuid() != 0:
        with pytest.raises(ConfigError):
            checkpoint_identity(str(tmp_path / "m"), None)
