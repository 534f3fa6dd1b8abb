"""kvmux.tier.worker.store_worker with several KV cache groups: one entry per group's block."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")

from kvmux import codec  # noqa: E402
from kvmux.keys import block_keys, group_key, namespace_id, store_key  # noqa: E402
from kvmux.metrics import TierStats  # noqa: E402
from kvmux.stores import DictStore, KVStore  # noqa: E402
from kvmux.tier.scheduler.plan import BlockTransfer, TierStepPlan  # noqa: E402
from kvmux.tier.worker.store_worker import StoreWorker  # noqa: E402

NUM_BLOCKS = 6
NS = namespace_id({"m": "hybrid"})
KEYS = block_keys(NS, list(range(2 * 16)), 16)
GROUPS = [["full.0", "full.1"], ["window.0", "window.1"]]


def _shared_caches(random: bool) -> dict[str, torch.Tensor]:
    """As vLLM lays out a hybrid model: layer i of each group shares one tensor."""
    generator = torch.Generator().manual_seed(7)
    tensors = [
        torch.randn((NUM_BLOCKS, 2, 4, 8), generator=generator)
        if random
        else torch.zeros((NUM_BLOCKS, 2, 4, 8))
        for _ in range(2)
    ]
    return {
        "full.0": tensors[0],
        "window.0": tensors[0],
        "full.1": tensors[1],
        "window.1": tensors[1],
    }


@pytest.fixture
def workers() -> Iterator[list[StoreWorker]]:
    made: list[StoreWorker] = []
    yield made
    for worker in made:
        worker.close()


def _worker(
    made: list[StoreWorker], store: KVStore, caches: dict[str, torch.Tensor], **options: int
) -> StoreWorker:
    worker = StoreWorker(store, NS, 0, TierStats(), **options)
    worker.register(caches, NUM_BLOCKS, GROUPS)
    made.append(worker)
    return worker


def test_each_group_saves_and_loads_its_own_layers(workers: list[StoreWorker]) -> None:
    store = DictStore(1 << 20)
    source = _shared_caches(random=True)
    full, window = KEYS[0], group_key(KEYS[0], 1)
    saver = _worker(workers, store, source)
    saver.save(TierStepPlan(saves=[BlockTransfer(full, 1, 0), BlockTransfer(window, 2, 1)]))
    saver.flush()
    for key in (full, window):
        data = store.get(store_key(key, 0))
        assert data is not None
        assert len(codec.decode(data, NS, store_key(key, 0)).layers) == 2  # not every layer

    target = _shared_caches(random=False)
    loader = _worker(workers, store, target)
    loader.load([BlockTransfer(full, 4, 0), BlockTransfer(window, 5, 1)])
    assert loader.take_load_errors() == set()
    for name in ("full.0", "full.1"):
        assert torch.equal(target[name][4], source[name][1])
        assert torch.equal(target[name][5], source[name][2])  # the tensors are shared
    assert not target["full.0"][:4].any()


def test_an_entry_loaded_as_another_group_is_a_load_error(workers: list[StoreWorker]) -> None:
    store = DictStore(1 << 20)
    source = {
        "full.0": torch.randn((NUM_BLOCKS, 2, 4, 8)),
        "window.0": torch.randn((NUM_BLOCKS, 1, 4, 8)),
    }
    saver = StoreWorker(store, NS, 0, TierStats())
    workers.append(saver)
    saver.register(source, NUM_BLOCKS, [["full.0"], ["window.0"]])
    saver.save(TierStepPlan(saves=[BlockTransfer(KEYS[1], 3, 1)]))
    saver.flush()
    saver.load([BlockTransfer(KEYS[1], 4, 0)])  # its layers are not group 0's
    assert saver.take_load_errors() == {4}


def test_the_save_queue_counts_each_group_at_its_own_size(workers: list[StoreWorker]) -> None:
    store = DictStore(1 << 20)
    caches = {
        "full.0": torch.randn((NUM_BLOCKS, 2, 4, 8)),
        "window.0": torch.randn((NUM_BLOCKS, 1, 4, 8)),
    }
    full_bytes, window_bytes = 2 * 4 * 8 * 4, 1 * 4 * 8 * 4
    stats = TierStats()
    worker = StoreWorker(store, NS, 0, stats, save_queue=full_bytes + window_bytes)
    workers.append(worker)
    worker.register(caches, NUM_BLOCKS, [["full.0"], ["window.0"]])
    saves = [BlockTransfer(KEYS[0], 1, 0), BlockTransfer(group_key(KEYS[0], 1), 2, 1)]
    worker.save(TierStepPlan(saves=[*saves, BlockTransfer(KEYS[1], 3, 0)]))
    worker.flush()
    assert stats.dropped_saves == 1
    assert stats.saved_blocks == 2
    assert worker.take_missing() == {KEYS[1]}
