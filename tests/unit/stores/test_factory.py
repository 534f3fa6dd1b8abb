"""kvmux.stores.factory: specs to stores."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvmux.config import DiskSpec, MemorySpec, parse_store_spec
from kvmux.errors import StoreUnavailable
from kvmux.stores import DictStore, DiskStore, open_store


def test_open_memory_spec_as_a_dict_store() -> None:
    store = open_store(MemorySpec(capacity=123, name="ram"))
    assert isinstance(store, DictStore)
    assert (store.capacity, store.name) == (123, "ram")


def test_open_disk_store(tmp_path: Path) -> None:
    store = open_store(DiskSpec(path=tmp_path / "kv", capacity=456, name="ssd"))
    assert isinstance(store, DiskStore)
    assert (store.capacity, store.name, store.root) == (456, "ssd", tmp_path / "kv")


def test_open_parsed_spec(tmp_path: Path) -> None:
    spec = parse_store_spec({"type": "disk", "path": str(tmp_path / "d"), "capacity": "1KiB"})
    store = open_store(spec)
    assert store.put(b"k" * 16, b"v")
    assert store.get(b"k" * 16) == b"v"


def test_open_unavailable_disk_store(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(StoreUnavailable):
        open_store(DiskSpec(path=tmp_path / "f" / "kv", capacity=1))


def test_unknown_spec() -> None:
    with pytest.raises(TypeError):
        open_store(object())  # type: ignore[arg-type]
