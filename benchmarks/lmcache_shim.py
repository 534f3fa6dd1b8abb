"""Installed into the LMCache benchmark venv only (see scripts/setup-lmcache.sh).

vLLM 0.32's CPU kernel-override pass (vllm.triton_utils.dispatcher) calls ``vars()`` on every
module global it finds. LMCache imports numba, which brings ``llvmlite.binding.ffi.lib``: an
object whose ``__getattr__`` answers every name, ``__dict__`` included, so ``vars(lib)`` is not
a dict and the engine dies at start. Giving that one object an empty ``__dict__`` lets the
peer run unchanged otherwise.
"""

from __future__ import annotations

try:
    import llvmlite.binding.ffi as _ffi
except ImportError:  # nothing to mend
    pass
else:

    class _ScanSafeLib(_ffi._lib_wrapper):  # type: ignore[misc]
        __slots__ = ()

        @property
        def __dict__(self) -> dict[str, object]:  # type: ignore[override]
            return {}

    _ffi.lib.__class__ = _ScanSafeLib
