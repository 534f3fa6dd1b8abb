"""The package layout: one package per role, and the imports each role may make.

Read with ``ast`` (nothing is imported), including imports inside functions and
``TYPE_CHECKING`` blocks.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest

import kvmux

ROOT = Path(kvmux.__file__).parent
TOP_LEVEL = {"__init__", "cli", "codec", "config", "errors", "keys", "metrics"}
PACKAGES = {"mux", "policies", "stores", "testing", "tier", "tools", "vllm"}
TIER = {"__init__", "fences", "shards", "scheduler", "worker"}  # both sides of one protocol each
# The same role, the same name: each repeated basename, and the packages holding it.
ROLE_HOMES = {
    "scheduler": ["kvmux.mux", "kvmux.tier.scheduler"],
    "plan": ["kvmux.mux", "kvmux.tier.scheduler"],
    "worker": ["kvmux.mux", "kvmux.tier"],  # tier's is the package tier/worker/
    "base": ["kvmux.stores", "kvmux.tier.worker"],  # what the package's kinds derive from
}
TORCH_ALLOWED = ("kvmux.tier.worker", "kvmux.vllm", "kvmux.testing")  # packages
SCHEDULER_SIDE = "kvmux.tier.scheduler"
NEVER_ON_THE_SCHEDULER_SIDE = ("torch", "kvmux.tier.worker")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def _importers(prefix: str) -> set[str]:
    """Modules that import ``prefix`` or anything below it."""
    return {
        name
        for name, path in _modules().items()
        if any(i == prefix or i.startswith(prefix + ".") for i in _imports(path))
    }


def _in(name: str, packages: tuple[str, ...]) -> bool:
    """Whether module ``name`` is one of ``packages`` or below one."""
    return any(name == p or name.startswith(p + ".") for p in packages)


def _is_tooling(name: str) -> bool:
    return name.startswith(("kvmux.tools", "kvmux.testing")) or name == "kvmux.cli"


def test_top_level_holds_only_shared_vocabulary_and_the_cli() -> None:
    files = {p.stem for p in ROOT.glob("*.py")}
    folders = {p.name for p in ROOT.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert files == TOP_LEVEL
    assert folders == PACKAGES


def test_tier_splits_into_its_scheduler_and_worker_sides() -> None:
    assert {p.stem for p in (ROOT / "tier").iterdir() if p.name != "__pycache__"} == TIER


def test_only_the_adapter_and_the_testing_harness_import_vllm() -> None:
    allowed = ("kvmux.vllm", "kvmux.testing")
    outside = {m for m in _importers("vllm") if not m.startswith(allowed)}
    assert outside == set()


def test_the_library_never_imports_the_tools() -> None:
    assert {m for m in _importers("kvmux.tools") if not _is_tooling(m)} == set()
    assert {m for m in _importers("kvmux.testing") if not _is_tooling(m)} == set()


def _top_level_imports(path: Path) -> set[str]:
    """What a module imports when it is imported: ``TYPE_CHECKING`` blocks and function
    bodies left out."""
    found: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_the_package_holds_no_charts_and_no_multiconnector_at_import() -> None:
    """Charts belong to the benchmarks (benchmarks/), and so do studies of vLLM's
    MultiConnector: no module of the package imports matplotlib, none imports
    MultiConnector as it is imported."""
    assert _importers("matplotlib") == set()
    multi = "vllm.distributed.kv_transfer.kv_connector.v1.multi_connector"
    eager = {
        n for n, p in _modules().items() if any(i.startswith(multi) for i in _top_level_imports(p))
    }
    assert eager == set()


def test_the_package_never_imports_the_benchmarks() -> None:
    assert _importers("benchmarks") == set()


def test_torch_stays_on_the_worker_side() -> None:
    users = {m for m in _importers("torch") if not _in(m, TORCH_ALLOWED)}
    assert users == set()


def test_the_scheduler_side_never_imports_torch_nor_the_worker_side() -> None:
    for name, path in _modules().items():
        if _in(name, (SCHEDULER_SIDE,)):
            reached = {i for i in _imports(path) if _in(i, NEVER_ON_THE_SCHEDULER_SIDE)}
            assert reached == set(), name


@pytest.mark.parametrize("package", ["stores", "policies", "tier", "mux"])
def test_lower_roles_do_not_reach_up(package: str) -> None:
    """Stores move bytes, policies decide; neither knows tiers, the mux or vLLM."""
    above = {
        "stores": ("kvmux.tier", "kvmux.mux", "kvmux.vllm", "kvmux.tools"),
        "policies": ("kvmux.tier", "kvmux.mux", "kvmux.stores", "kvmux.vllm", "kvmux.tools"),
        "tier": ("kvmux.mux", "kvmux.vllm", "kvmux.tools"),
        "mux": ("kvmux.tier", "kvmux.stores", "kvmux.vllm", "kvmux.tools"),
    }[package]
    for name, path in _modules().items():
        if name.startswith(f"kvmux.{package}"):
            reached = {i for i in _imports(path) if i.startswith(above)}
            assert reached == set(), name


def test_basenames_repeat_only_for_the_same_role() -> None:
    library = {n: p for n, p in _modules().items() if not _is_tooling(n) and p.stem != "__init__"}
    repeated = {
        stem for stem, count in Counter(p.stem for p in library.values()).items() if count > 1
    }
    assert repeated <= set(ROLE_HOMES)
    for stem in repeated:
        homes = sorted(n.rpartition(".")[0] for n, p in library.items() if p.stem == stem)
        assert homes == ROLE_HOMES[stem], stem


def test_each_role_has_its_name_in_tier_and_mux() -> None:
    modules = _modules()
    for stem, homes in ROLE_HOMES.items():
        assert {f"{home}.{stem}" for home in homes} <= set(modules), stem
