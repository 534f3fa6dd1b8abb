"""Which weights an engine serves, from their contents: part of every key's namespace.

A local checkpoint (a directory of weight files, or one ``.gguf`` file) is identified by
each weight file's name, size and a BLAKE3 digest of sampled ranges of its bytes: the
first and last MiB (a safetensors header names every tensor and where it lies) and
``SAMPLES`` evenly spaced ranges between. Timestamps and paths of the machine are left
out, so engines on different machines agree, and weights copied over the old ones with
their times kept (``cp -p``, ``rsync -t``) get new keys. A hub model is identified the
same way through its snapshot in the local cache (whose folder name is the commit), or
else by the revision asked for. Weights that differ only outside the sampled ranges keep
the namespace: the store's ``epoch`` setting (or a reset) separates those.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from blake3 import blake3

from kvmux.errors import ConfigError

__all__ = ["WEIGHT_SUFFIXES", "checkpoint_identity", "file_identity"]

log = logging.getLogger(__name__)

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
EDGE_BYTES = 1 << 20  # read whole at each end of a file
SAMPLE_BYTES = 64 << 10  # each range sampled between the ends
SAMPLES = 16


def _ranges(size: int) -> list[tuple[int, int]]:
    """(offset, length) of every range read from a file of ``size`` bytes."""
    if size <= 2 * EDGE_BYTES + SAMPLES * SAMPLE_BYTES:
        return [(0, size)]
    middle = size - 2 * EDGE_BYTES - SAMPLE_BYTES
    picks = [EDGE_BYTES + middle * (i + 1) // (SAMPLES + 1) for i in range(SAMPLES)]
    return [(0, EDGE_BYTES), *((p, SAMPLE_BYTES) for p in picks), (size - EDGE_BYTES, EDGE_BYTES)]


def file_identity(path: Path) -> str:
    """A weight file's name, size and the digest of its sampled ranges."""
    digest = blake3()
    with path.open("rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        for offset, length in _ranges(size):
            handle.seek(offset)
            digest.update(handle.read(length))
    return f"{path.name}|{size}|{digest.hexdigest(16)}"


def _weight_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.iterdir() if p.name.endswith(WEIGHT_SUFFIXES) and p.is_file())


def _cached_snapshot(model: str, revision: str | None) -> Path | None:
    """The hub model's snapshot in the local cache, if it is there (no network)."""
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model, revision=revision, local_files_only=True))
    except Exception:  # absent from the cache, not a hub id, or no huggingface_hub
        return None


def checkpoint_identity(model: str, revision: str | None) -> str:
    """Which weights: a digest of the checkpoint's sampled contents (see the module)."""
    path = Path(model)
    if not path.exists():
        snapshot = _cached_snapshot(model, revision)
        if snapshot is None:
            log.warning(
                "kvmux: the weights of %s are identified by their revision (%s) only; set "
                "a tier's epoch when they change under the same revision",
                model,
                revision,
            )
            return f"revision:{revision}"
        path = snapshot
    digest = blake3()
    try:
        for weights in _weight_files(path):
            digest.update(file_identity(weights).encode() + b"\n")
    except OSError as exc:
        raise ConfigError("model", f"cannot read the checkpoint at {model}: {exc}") from exc
    return f"contents:{digest.hexdigest(16)}"
