"""Entries written around the page cache: alignment, fallback, failures, concurrency."""

from __future__ import annotations

import errno
import logging
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from kvmux.config import DiskSpec, parse_store_spec
from kvmux.errors import ConfigError, StoreError
from kvmux.stores import DiskStore, direct_io
from kvmux.stores import disk as disk_module
from kvmux.stores.direct_io import ALIGNMENT, DIRECT_MIN_BYTES, DirectRefused, DirectWriter
from kvmux.stores.factory import open_store

pytestmark = pytest.mark.skipif(not direct_io.O_DIRECT, reason="no O_DIRECT on this platform")


def _key(i: int) -> bytes:
    return i.to_bytes(16, "big")


def _value(size: int, seed: int = 0) -> bytes:
    return bytes((seed + i * 7) % 251 for i in range(size))


def _leftovers(store: DiskStore) -> list[str]:
    return os.listdir(store.root / "tmp")


class _Spy:
    """Counts the calls of DirectWriter.write_new, then makes them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.calls = 0
        real = DirectWriter.write_new

        def counted(writer: DirectWriter, *args: Any, **kwargs: Any) -> None:
            self.calls += 1
            real(writer, *args, **kwargs)

        monkeypatch.setattr(DirectWriter, "write_new", counted)


@pytest.mark.parametrize(
    "size",
    [DIRECT_MIN_BYTES, DIRECT_MIN_BYTES + 1, 3 * ALIGNMENT - 1, 16 * ALIGNMENT, 2**21 + 311],
)
def test_large_entries_are_written_directly_and_read_back_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    monkeypatch.setattr(disk_module, "DIRECT_MIN_BYTES", min(size, DIRECT_MIN_BYTES))
    spy = _Spy(monkeypatch)
    store = DiskStore(tmp_path / "kv", 1 << 30, direct_writes=True)
    value = _value(size)
    half = size // 2
    assert store.put_many_parts([(_key(1), [value[:half], memoryview(value)[half:]])]) == [True]
    assert spy.calls == 1
    assert store.get(_key(1)) == value
    assert store.used_bytes() == size
    path = store.root / _key(1).hex()[:2] / f"{_key(1).hex()}.kvx"
    assert path.stat().st_size == size  # cut back from the aligned length
    assert oct(path.stat().st_mode & 0o777) == oct(0o600)
    assert _leftovers(store) == []


def test_small_entries_go_through_the_page_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = _Spy(monkeypatch)
    store = DiskStore(tmp_path / "kv", 1 << 30, direct_writes=True)
    assert store.put(_key(1), _value(DIRECT_MIN_BYTES - 1))
    assert spy.calls == 0
    assert store.get(_key(1)) == _value(DIRECT_MIN_BYTES - 1)


def test_direct_writes_are_off_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spy = _Spy(monkeypatch)
    store = open_store(DiskSpec(path=tmp_path / "kv", capacity=1 << 30))
    assert isinstance(store, DiskStore) and not store.writes_directly
    assert store.put(_key(1), _value(2 * DIRECT_MIN_BYTES))
    assert spy.calls == 0


def test_direct_writes_off_never_writes_directly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = _Spy(monkeypatch)
    store = open_store(DiskSpec(path=tmp_path / "kv", capacity=1 << 30, direct_writes=False))
    assert isinstance(store, DiskStore) and not store.writes_directly
    assert store.put(_key(1), _value(2 * DIRECT_MIN_BYTES))
    assert spy.calls == 0
    assert store.get(_key(1)) == _value(2 * DIRECT_MIN_BYTES)


def _refusing_open(real: Any) -> Any:
    def fake_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & direct_io.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return int(real(path, flags, *args, **kwargs))

    return fake_open


def test_a_file_system_refusing_o_direct_falls_back_for_good(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(os, "open", _refusing_open(os.open))
    spy = _Spy(monkeypatch)
    store = DiskStore(tmp_path / "kv", 1 << 30, direct_writes=True)
    with caplog.at_level(logging.INFO, logger="kvmux.stores.disk"):
        for i in range(3):
            assert store.put(_key(i), _value(DIRECT_MIN_BYTES, seed=i))
    assert spy.calls == 1  # asked once, then through the page cache
    expected = (
        f"kvmux disk disk: {store.root} refuses O_DIRECT (Invalid argument); "
        "writing through the page cache"
    )
    assert [r.getMessage() for r in caplog.records].count(expected) == 1
    for i in range(3):
        assert store.get(_key(i)) == _value(DIRECT_MIN_BYTES, seed=i)
    assert _leftovers(store) == []


def test_a_refused_direct_write_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refusing_write(fd: int, data: Any) -> int:
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(os, "write", refusing_write)
    path = tmp_path / "entry.part"
    with pytest.raises(DirectRefused):
        DirectWriter().write_new(str(path), [_value(DIRECT_MIN_BYTES)])
    assert not path.exists()


def test_a_failed_direct_write_is_a_store_error_and_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = DiskStore(tmp_path / "kv", 1 << 30, direct_writes=True)

    def short_write(fd: int, data: Any) -> int:
        return 100  # not a whole block: the write cannot go on aligned

    monkeypatch.setattr(os, "write", short_write)
    with pytest.raises(StoreError, match="disk store 'disk': write failed"):
        store.put(_key(1), _value(DIRECT_MIN_BYTES))
    monkeypatch.undo()
    assert _leftovers(store) == []
    assert store.get(_key(1)) is None
    assert store.put(_key(1), _value(DIRECT_MIN_BYTES))  # the next write goes directly again
    assert store.get(_key(1)) == _value(DIRECT_MIN_BYTES)


def test_concurrent_writers_never_share_a_buffer(tmp_path: Path) -> None:
    store = DiskStore(tmp_path / "kv", 1 << 30, direct_writes=True)
    errors: list[BaseException] = []

    def writer(first: int) -> None:
        try:
            for i in range(first, first + 8):
                assert store.put(_key(i), _value(DIRECT_MIN_BYTES + i, seed=i))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(8 * t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    for i in range(32):
        assert store.get(_key(i)) == _value(DIRECT_MIN_BYTES + i, seed=i)


def test_the_kept_buffer_grows_and_is_reused(tmp_path: Path) -> None:
    writer = DirectWriter()
    for index, size in enumerate([DIRECT_MIN_BYTES, 4 * DIRECT_MIN_BYTES, 2 * DIRECT_MIN_BYTES]):
        path = tmp_path / f"{index}.part"
        writer.write_new(str(path), [_value(size, seed=index)])
        assert path.read_bytes() == _value(size, seed=index)
    assert writer._buffer is not None and len(writer._buffer) == 4 * DIRECT_MIN_BYTES


def test_an_existing_file_is_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "taken.part"
    path.write_bytes(b"mine")
    with pytest.raises(FileExistsError):
        DirectWriter().write_new(str(path), [_value(DIRECT_MIN_BYTES)])
    assert path.read_bytes() == b"mine"


def test_direct_writes_config_key() -> None:
    spec = parse_store_spec({"type": "disk", "path": "/x", "capacity": "1GiB"})
    assert isinstance(spec, DiskSpec) and not spec.direct_writes
    spec = parse_store_spec(
        {"type": "disk", "path": "/x", "capacity": "1GiB", "direct_writes": True}
    )
    assert isinstance(spec, DiskSpec) and spec.direct_writes
    with pytest.raises(ConfigError, match=r"store\.direct_writes.*expected a boolean"):
        parse_store_spec({"type": "disk", "path": "/x", "capacity": "1GiB", "direct_writes": 1})
    with pytest.raises(ConfigError, match=r"store\.direct_writes.*unknown key"):
        parse_store_spec({"type": "memory", "capacity": "1GiB", "direct_writes": True})
