"""The benchmark engines' allocator: TCMalloc found and preloaded, or a clear refusal."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import allocator
from benchmarks.allocator import AllocatorMissing, allocator_env, find_tcmalloc


@pytest.fixture
def no_bundled(monkeypatch: pytest.MonkeyPatch) -> None:
    """A vLLM wheel without a TCMalloc of its own (as the CPU wheel from PyPI)."""
    monkeypatch.setattr(allocator, "vllm_tcmalloc", lambda: None)


def test_find_tcmalloc_takes_the_first_directory_that_has_it(tmp_path: Path) -> None:
    empty, lib = tmp_path / "empty", tmp_path / "lib"
    empty.mkdir()
    lib.mkdir()
    (lib / "libtcmalloc_minimal.so.4").write_bytes(b"")
    assert find_tcmalloc((str(empty), str(lib))) == lib / "libtcmalloc_minimal.so.4"
    assert find_tcmalloc((str(empty),)) is None


@pytest.mark.usefixtures("no_bundled")
def test_auto_preloads_the_installed_tcmalloc_before_what_is_preloaded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(allocator, "find_tcmalloc", lambda: Path("/lib/libtcmalloc.so.4"))
    monkeypatch.setenv("LD_PRELOAD", "/lib/other.so")
    name, env = allocator_env("auto")
    assert name == "tcmalloc (/lib/libtcmalloc.so.4)"
    assert env == {"LD_PRELOAD": "/lib/libtcmalloc.so.4:/lib/other.so"}


@pytest.mark.usefixtures("no_bundled")
def test_without_tcmalloc_auto_falls_back_and_tcmalloc_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(allocator, "find_tcmalloc", lambda: None)
    name, env = allocator_env("auto")
    assert name.startswith("system") and env == {}
    with pytest.raises(AllocatorMissing, match="libtcmalloc-minimal4"):
        allocator_env("tcmalloc")


@pytest.mark.usefixtures("no_bundled")
def test_system_leaves_the_engines_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator, "find_tcmalloc", lambda: Path("/lib/libtcmalloc.so.4"))
    assert allocator_env("system") == ("system (glibc malloc)", {})


def test_vllms_own_tcmalloc_needs_nothing_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator, "vllm_tcmalloc", lambda: Path("/v/libs/libtcmalloc.so.4"))
    assert allocator_env("auto") == ("tcmalloc (vLLM's own, libtcmalloc.so.4)", {})


def test_an_unknown_allocator_is_refused() -> None:
    with pytest.raises(ValueError, match="jemalloc"):
        allocator_env("jemalloc")
