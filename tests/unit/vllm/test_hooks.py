"""Every KV connector hook of every supported vLLM release is MuxConnector's own.

``vllm_hooks/<major.minor>.json`` lists the public hooks of ``KVConnectorBase_V1`` and of
the mixin protocols beside it (``SupportsHMA``) in one vLLM release, as
``scripts/vllm_hooks.py`` reads them from that release's ``base.py`` with ``ast``.
Regenerate a table with ``scripts/vllm_hooks.py <version> -o tests/unit/vllm/vllm_hooks/<v>.json``.

- The table of the installed release must equal both a fresh read of the installed
  ``base.py`` and the live classes, so the tables stay true.
- For every release, each hook must be defined by MuxConnector itself (or a kvmux base or
  mixin of it): a hook left to vLLM's base class silently skips the children. Hooks whose
  base default is right for the mux are listed in ``INHERITED_ON_PURPOSE`` with a reason.
- A hook MuxConnector overrides keeps the release's kind and parameter names, since vLLM
  calls some hooks by keyword.
- Hooks of vLLM main that no release has yet (``MAIN_ONLY_HOOKS``) are MuxConnector's own
  too, with main's signatures.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import tomllib
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from vllm.distributed.kv_transfer.kv_connector.v1 import base as vllm_base

from kvmux.vllm import MuxConnector

ROOT = Path(__file__).resolve().parents[3]
TABLES = Path(__file__).with_name("vllm_hooks")


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "kvmux_vllm_hooks", ROOT / "scripts/vllm_hooks.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


hooks_script = _load_script()


def _release_key(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in name.split("."))


RELEASES: dict[str, dict[str, Any]] = {
    path.stem: json.loads(path.read_text())
    for path in sorted(TABLES.glob("*.json"), key=lambda p: _release_key(p.stem))
}

# Hooks whose vLLM base-class default is already right for the mux, and why.
INHERITED_ON_PURPOSE: dict[str, str] = {
    "role": "the mux's own role, set by KVConnectorBase_V1.__init__; children get the same",
}

# Hooks of KVConnectorBase_V1 on vLLM main (vllm-project/vllm at 00f4240e) that no release
# table has yet, as scripts/vllm_hooks.py lists them; drop one once a release's table has it.
MAIN_ONLY_HOOKS: dict[str, dict[str, Any]] = {
    "can_load_prefix_replay_checkpoint": {
        "kind": "method",
        "params": ["request", "num_local_tokens", "num_external_tokens"],
    },
    "consume_prefix_replay_checkpoint": {
        "kind": "method",
        "params": ["request", "num_hit_tokens"],
    },
}

# Kinds of a base hook that an override may have.
COMPATIBLE_KINDS = {
    "abstract": {"method"},
    "method": {"method"},
    "property": {"property"},
    "classmethod": {"classmethod"},
    "staticmethod": {"staticmethod"},
}


def _minor(release: str) -> str:
    return ".".join(release.split(".")[:2])


def _hooks(table: dict[str, Any]) -> dict[str, tuple[str, dict[str, Any]]]:
    """hook name -> (class that declares it, its entry), over the base class and mixins."""
    found: dict[str, tuple[str, dict[str, Any]]] = {}
    for class_name, entry in table["classes"].items():
        for hook, spec in entry["hooks"].items():
            found.setdefault(hook, (class_name, spec))
    return found


def _kvmux_owner(name: str) -> type | None:
    """The kvmux class in MuxConnector's MRO that defines ``name``, if the first one does."""
    owner = next((cls for cls in MuxConnector.__mro__ if name in cls.__dict__), None)
    if owner is None or not owner.__module__.startswith("kvmux"):
        return None
    return owner


def _live_table(cls: type) -> dict[str, Any]:
    hooks = {}
    for name in cls.__dict__:
        if name.startswith("_"):
            continue
        found = hooks_script.kind_and_params(cls, name)
        if found is not None:
            hooks[name] = {"kind": found[0], "params": found[1]}
    init = cls.__dict__.get("__init__")
    return {
        "hooks": dict(sorted(hooks.items())),
        "init": None if init is None else hooks_script.signature_params(init, drop_first=True),
    }


def _accepts(override: list[str], release: list[str]) -> bool:
    """Same parameter names, or named leading ones followed by ``*args, **kwargs``."""
    if override == release:
        return True
    if len(override) >= 2 and override[-2].startswith("*") and override[-1].startswith("**"):
        named = override[:-2]
        return override[-2] != "*" and release[: len(named)] == named
    return False


# -- (a) the tables are true ----------------------------------------------------------


def test_every_supported_release_has_a_table() -> None:
    """Each minor release that pyproject's ``vllm`` extra allows has a hook table."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    spec = next(d for d in pyproject["project"]["optional-dependencies"]["vllm"])
    low = re.search(r">=\s*(\d+)\.(\d+)", spec)
    high = re.search(r"<\s*(\d+)\.(\d+)", spec)
    assert low and high, f"cannot read the supported vLLM range from {spec!r}"
    assert low.group(1) == high.group(1), f"a range across major releases: {spec!r}"
    supported = [f"{low.group(1)}.{m}" for m in range(int(low.group(2)), int(high.group(2)))]
    missing = [release for release in supported if release not in RELEASES]
    assert not missing, f"no hook table for vLLM {missing} in {TABLES}"


def test_tables_name_their_release() -> None:
    for minor, table in RELEASES.items():
        assert _minor(table["release"]) == minor, f"{minor}.json was made from {table['release']}"
        assert table["base_class"] == "KVConnectorBase_V1"
        assert "KVConnectorBase_V1" in table["classes"]


def test_installed_release_table_matches_base_py() -> None:
    """A fresh ``ast`` read of the installed base.py gives the committed table."""
    installed = hooks_script.installed_release()
    assert _minor(installed) in RELEASES, f"no hook table for the installed vLLM {installed}"
    fresh = hooks_script.hooks_from_source(hooks_script.installed_base_py().read_text())
    assert fresh["classes"] == RELEASES[_minor(installed)]["classes"], (
        f"vllm_hooks/{_minor(installed)}.json is stale: regenerate it with "
        "scripts/vllm_hooks.py installed -o ..."
    )


def test_installed_release_table_matches_live_classes() -> None:
    """The installed classes, introspected live, have exactly the table's hooks."""
    table = RELEASES[_minor(hooks_script.installed_release())]
    for class_name, entry in table["classes"].items():
        live = _live_table(getattr(vllm_base, class_name))
        assert live["hooks"] == entry["hooks"], class_name
        assert live["init"] == entry["init"], class_name


# -- (b) every hook is MuxConnector's own ---------------------------------------------


@pytest.mark.parametrize("release", list(RELEASES))
def test_mux_defines_every_hook(release: str) -> None:
    missing = [
        f"{class_name}.{hook}({', '.join(spec['params'])}) [{spec['kind']}]"
        for hook, (class_name, spec) in sorted(_hooks(RELEASES[release]).items())
        if _kvmux_owner(hook) is None and hook not in INHERITED_ON_PURPOSE
    ]
    assert not missing, (
        f"vLLM {release}: MuxConnector neither defines nor lists in INHERITED_ON_PURPOSE "
        f"{len(missing)} hook(s): " + "; ".join(missing)
    )


def test_inherited_on_purpose_is_current() -> None:
    """Each entry is a hook of some release, and one that MuxConnector does not define."""
    every = {hook for table in RELEASES.values() for hook in _hooks(table)}
    unknown = sorted(set(INHERITED_ON_PURPOSE) - every)
    assert not unknown, f"INHERITED_ON_PURPOSE names no hook of any release: {unknown}"
    defined = sorted(h for h in INHERITED_ON_PURPOSE if _kvmux_owner(h) is not None)
    assert not defined, (
        f"MuxConnector defines these, drop them from INHERITED_ON_PURPOSE: {defined}"
    )


# -- (c) overrides keep the release's signature ---------------------------------------


@pytest.mark.parametrize("release", list(RELEASES))
def test_mux_overrides_keep_signatures(release: str) -> None:
    wrong = []
    for hook, (class_name, spec) in sorted(_hooks(RELEASES[release]).items()):
        owner = _kvmux_owner(hook)
        if owner is None:
            continue
        found = hooks_script.kind_and_params(owner, hook)
        assert found is not None, f"{owner.__name__}.{hook} is not a method or property"
        kind, params = found
        if kind not in COMPATIBLE_KINDS[spec["kind"]]:
            wrong.append(f"{hook}: a {kind} in kvmux, a {spec['kind']} in {class_name}")
        elif not _accepts(params, spec["params"]):
            wrong.append(
                f"{hook}({', '.join(params)}), {class_name} has ({', '.join(spec['params'])})"
            )
    assert not wrong, f"vLLM {release}: MuxConnector overrides differ: " + "; ".join(wrong)


# -- (d) hooks of vLLM main that no release has yet ----------------------------------


@pytest.mark.parametrize("hook", sorted(MAIN_ONLY_HOOKS))
def test_mux_defines_main_only_hooks_with_mains_signature(hook: str) -> None:
    owner = _kvmux_owner(hook)
    assert owner is not None, f"MuxConnector does not define vLLM main's {hook}"
    found = hooks_script.kind_and_params(owner, hook)
    assert found is not None, f"{owner.__name__}.{hook} is not a method or property"
    kind, params = found
    assert kind in COMPATIBLE_KINDS[MAIN_ONLY_HOOKS[hook]["kind"]], kind
    assert _accepts(params, MAIN_ONLY_HOOKS[hook]["params"]), params


def test_main_only_hooks_are_in_no_release_table() -> None:
    every = {hook for table in RELEASES.values() for hook in _hooks(table)}
    released = sorted(set(MAIN_ONLY_HOOKS) & every)
    assert not released, f"a release table has these, drop them from MAIN_ONLY_HOOKS: {released}"


# -- the script itself ----------------------------------------------------------------

SAMPLE = """
import abc
from abc import ABC, abstractmethod


class Plain:
    def hidden(self): ...


class SupportsThing(ABC):
    @abstractmethod
    def thing(self, a, *, b): ...


class Checked:
    def checked(self, x, /, y=1, *rest, z, **extra): ...


def supports_checked(obj):
    return isinstance(obj, (Checked,))


class KVConnectorBase_V1(ABC):
    label = "not a hook"

    def __init__(self, vllm_config, role, kv_cache_config): ...

    @property
    def role(self): ...

    @role.setter
    def role(self, value): ...

    @classmethod
    def layout(cls, vllm_config): ...

    @staticmethod
    def helper(a, b=2): ...

    @abc.abstractmethod
    def start_load_kv(self, forward_context, **kwargs): ...

    def _private(self): ...

    if True:
        def nested(self, request): ...
"""


def test_script_reads_kinds_params_and_mixins() -> None:
    table = hooks_script.hooks_from_source(SAMPLE, "9.9.9")
    assert table["release"] == "9.9.9"
    assert set(table["classes"]) == {"KVConnectorBase_V1", "SupportsThing", "Checked"}
    base = table["classes"]["KVConnectorBase_V1"]
    assert base["role"] == "base"
    assert base["init"] == ["vllm_config", "role", "kv_cache_config"]
    assert base["hooks"] == {
        "helper": {"kind": "staticmethod", "params": ["a", "b"]},
        "layout": {"kind": "classmethod", "params": ["vllm_config"]},
        "nested": {"kind": "method", "params": ["request"]},
        "role": {"kind": "property", "params": []},
        "start_load_kv": {"kind": "abstract", "params": ["forward_context", "**kwargs"]},
    }
    assert table["classes"]["SupportsThing"]["hooks"] == {
        "thing": {"kind": "abstract", "params": ["a", "*", "b"]}
    }
    assert table["classes"]["Checked"]["role"] == "mixin"
    assert table["classes"]["Checked"]["hooks"]["checked"]["params"] == [
        "x",
        "/",
        "y",
        "*rest",
        "z",
        "**extra",
    ]


def test_script_reads_live_classes_the_same_way() -> None:
    namespace: dict[str, Any] = {}
    exec(compile(SAMPLE, "<sample>", "exec"), namespace)
    table = hooks_script.hooks_from_source(SAMPLE)
    for class_name, entry in table["classes"].items():
        live = _live_table(namespace[class_name])
        assert live == {"hooks": entry["hooks"], "init": entry["init"]}, class_name


def test_script_reads_a_wheel(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wheel = tmp_path / "vllm-9.8.7-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(hooks_script.BASE_PY, SAMPLE)
    assert hooks_script.main([str(wheel)]) == 0
    table = json.loads(capsys.readouterr().out)
    assert table["release"] == "9.8.7"
    assert "start_load_kv" in table["classes"]["KVConnectorBase_V1"]["hooks"]
    out = tmp_path / "out" / "9.8.json"
    assert hooks_script.main([str(wheel), "-o", str(out), "--release", "9.8.0"]) == 0
    assert json.loads(out.read_text())["release"] == "9.8.0"
