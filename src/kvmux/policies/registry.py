"""Selection policies by name, imported only when a connector asks for one."""

from __future__ import annotations

import importlib

from kvmux.errors import ConfigError
from kvmux.policies.selection import SelectionPolicy

__all__ = ["make_policy", "policy_names", "register_policy"]

# name -> (module, factory): a factory is a class or function returning a SelectionPolicy
_POLICIES: dict[str, tuple[str, str]] = {
    "first": ("kvmux.policies.selection", "first"),
    "longest": ("kvmux.policies.selection", "longest"),
    "compose": ("kvmux.policies.selection", "Compose"),
}


def register_policy(name: str, module: str, factory: str) -> None:
    """Make ``"policy": name`` build ``module.factory()``; a name is registered once."""
    if name in _POLICIES:
        raise ValueError(f"selection policy {name!r} is already registered")
    _POLICIES[name] = (module, factory)  # imported when first made (``make_policy``)


def policy_names() -> tuple[str, ...]:
    """Every registered policy's name, in registration order."""
    return tuple(_POLICIES)


def make_policy(name: str) -> SelectionPolicy:
    """A new instance of the policy registered as ``name``."""
    try:
        module, factory = _POLICIES[name]
    except KeyError:
        raise ConfigError("policy", f"unknown policy {name!r}", policy_names()) from None
    try:
        build = getattr(importlib.import_module(module), factory)
    except (ImportError, AttributeError) as exc:
        raise ConfigError("policy", f"policy {name!r} cannot be loaded: {exc}") from exc
    policy: SelectionPolicy = build()
    return policy
