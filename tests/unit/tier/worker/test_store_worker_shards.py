"""StoreWorker over shards (``kvmux.tier.shards``): entries any tensor-parallel size loads.

Fake KV caches in vLLM's ``[blocks, heads, tokens, bytes]`` view (and the older
``[2, blocks, tokens, heads, head size]``): what one TP size saves, another loads, byte
for byte, each rank reading and writing only its own heads.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")

from kvmux import codec  # noqa: E402
from kvmux.errors import UnsupportedLayout  # noqa: E402
from kvmux.keys import BlockKey, block_keys, namespace_id, store_key  # noqa: E402
from kvmux.metrics import TierStats  # noqa: E402
from kvmux.stores import DictStore, KVStore  # noqa: E402
from kvmux.tier.scheduler.index import SharedStoreView  # noqa: E402
from kvmux.tier.scheduler.plan import BlockTransfer, TierStepPlan  # noqa: E402
from kvmux.tier.shards import BlockShards, block_shards  # noqa: E402
from kvmux.tier.worker.store_worker import StoreWorker  # noqa: E402

NUM_BLOCKS = 6
HEADS = 4
NS = namespace_id({"m": "shards"})
K1, K2 = block_keys(NS, list(range(2 * 16)), 16)
# (shape of one layer for a rank with ``h`` heads, the dimension of heads)
LAYOUTS = {
    "blocks_heads": (lambda h: (NUM_BLOCKS, h, 16, 32), 1),
    "kv_blocks_tokens_heads": (lambda h: (2, NUM_BLOCKS, 16, h, 8), 3),
}


@pytest.fixture(params=list(LAYOUTS))
def layout(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def workers() -> Iterator[list[StoreWorker]]:
    made: list[StoreWorker] = []
    yield made
    for worker in made:
        worker.close()


def _full(layout: str, seed: int = 7) -> dict[str, torch.Tensor]:
    """Every head of every layer: what a TP=1 engine holds."""
    shape, _ = LAYOUTS[layout]
    generator = torch.Generator().manual_seed(seed)
    return {f"layer.{i}": torch.randn(shape(HEADS), generator=generator) for i in range(3)}


def _rank_caches(full: dict[str, torch.Tensor], layout: str, shards: BlockShards) -> dict:
    """The caches of a rank holding ``shards.local`` heads (zeros: before any load)."""
    _, axis = LAYOUTS[layout]
    return {
        name: torch.zeros_like(t.narrow(axis, 0, len(shards.local))) for name, t in full.items()
    }


def _heads_of(full: dict[str, torch.Tensor], layout: str, shards: BlockShards) -> dict:
    _, axis = LAYOUTS[layout]
    index = torch.tensor(shards.local)
    return {name: t.index_select(axis, index) for name, t in full.items()}


def _worker(
    workers: list[StoreWorker],
    store: KVStore,
    caches: dict[str, torch.Tensor],
    shards: BlockShards,
    stats: TierStats | None = None,
) -> StoreWorker:
    worker = StoreWorker(store, NS, 0, stats or TierStats(), shards=shards)
    worker.register(caches, NUM_BLOCKS)
    workers.append(worker)
    return worker


def _save(worker: StoreWorker, *transfers: tuple[BlockKey, int]) -> None:
    worker.save(TierStepPlan(saves=[BlockTransfer(k, b) for k, b in transfers]))
    worker.flush()


def _block(tensor: torch.Tensor, layout: str, block_id: int) -> torch.Tensor:
    return tensor.select(0 if layout == "blocks_heads" else 1, block_id)


@pytest.mark.parametrize(("saver_tp", "loader_tp"), [(1, 2), (2, 1), (1, 4), (4, 2), (2, 8)])
def test_what_one_tp_size_saves_another_loads_byte_for_byte(
    layout: str, saver_tp: int, loader_tp: int, workers: list[StoreWorker]
) -> None:
    store = DictStore(1 << 24)
    full = _full(layout)
    for rank in range(saver_tp):
        shards = block_shards(HEADS, saver_tp, rank)
        saver = _worker(workers, store, _heads_of(full, layout, shards), shards)
        _save(saver, (K1, 2), (K2, 3))
    view = SharedStoreView(store, TierStats(), shards=HEADS)
    assert view.count_prefix([K1, K2]) == 2
    assert len(store) == 2 * HEADS  # one entry per head and block, whatever the TP size
    for rank in range(loader_tp):
        shards = block_shards(HEADS, loader_tp, rank)
        caches = _rank_caches(full, layout, shards)
        loader = _worker(workers, store, caches, shards)
        loader.load([BlockTransfer(K1, 4), BlockTransfer(K2, 5)])
        assert loader.take_load_errors() == set()
        want = _heads_of(full, layout, shards)
        for name, got in caches.items():
            assert torch.equal(_block(got, layout, 4), _block(want[name], layout, 2))
            assert torch.equal(_block(got, layout, 5), _block(want[name], layout, 3))
            assert not _block(got, layout, 1).any()


def test_a_rank_stores_and_reads_only_its_heads_bytes(workers: list[StoreWorker]) -> None:
    full = _full("blocks_heads")
    one, two = TierStats(), [TierStats(), TierStats()]
    whole = block_shards(HEADS, 1, 0)
    _save(
        _worker(workers, DictStore(1 << 24), _heads_of(full, "blocks_heads", whole), whole, one),
        (K1, 1),
    )
    store = DictStore(1 << 24)
    for rank in range(2):
        shards = block_shards(HEADS, 2, rank)
        saver = _worker(workers, store, _heads_of(full, "blocks_heads", shards), shards, two[rank])
        _save(saver, (K1, 1))
    assert two[0].bytes_saved == two[1].bytes_saved == one.bytes_saved // 2
    shards = block_shards(HEADS, 2, 1)
    stats = TierStats()
    loader = _worker(workers, store, _rank_caches(full, "blocks_heads", shards), shards, stats)
    loader.load([BlockTransfer(K1, 0)])
    assert stats.bytes_loaded == two[1].bytes_saved


def test_replicated_heads_are_written_by_one_rank_and_read_by_all(
    workers: list[StoreWorker],
) -> None:
    store = DictStore(1 << 24)
    full = _full("blocks_heads")
    stats = [TierStats() for _ in range(8)]
    for rank in range(8):  # TP=8 over 4 heads: each head on two ranks
        shards = block_shards(HEADS, 8, rank)
        saver = _worker(
            workers, store, _heads_of(full, "blocks_heads", shards), shards, stats[rank]
        )
        _save(saver, (K1, 1))
    assert [s.saved_blocks for s in stats] == [1, 0] * 4
    assert len(store) == HEADS


def test_a_missing_shard_is_no_hit_and_a_load_error_only_where_it_is_needed(
    workers: list[StoreWorker],
) -> None:
    store = DictStore(1 << 24)
    full = _full("blocks_heads")
    whole = block_shards(HEADS, 1, 0)
    _save(_worker(workers, store, _heads_of(full, "blocks_heads", whole), whole), (K1, 1), (K2, 2))
    store.delete(store_key(K2, 3))  # head 3 of the second block: held by rank 1 of two
    assert SharedStoreView(store, TierStats(), shards=HEADS).count_prefix([K1, K2]) == 1
    for rank, failed in ((0, set()), (1, {5})):
        shards = block_shards(HEADS, 2, rank)
        loader = _worker(workers, store, _rank_caches(full, "blocks_heads", shards), shards)
        loader.load([BlockTransfer(K1, 4), BlockTransfer(K2, 5)])
        assert loader.take_load_errors() == failed
        assert loader.take_missing() == ({K2} if failed else set())


def test_an_entry_of_a_whole_block_under_a_shard_key_is_a_miss(
    workers: list[StoreWorker],
) -> None:
    store = DictStore(1 << 24)
    full = _full("blocks_heads")
    unsplit = BlockShards()  # every head in one entry, under shard 0's key
    _save(
        _worker(workers, store, _heads_of(full, "blocks_heads", block_shards(HEADS)), unsplit),
        (K1, 1),
    )
    shards = block_shards(HEADS, 2, 0)
    caches = _rank_caches(full, "blocks_heads", shards)
    loader = _worker(workers, store, caches, shards)
    loader.load([BlockTransfer(K1, 4)])
    assert loader.take_load_errors() == {4}
    assert not any(t.any() for t in caches.values())


def test_pipeline_stages_store_their_own_layers_and_a_hit_needs_both(
    workers: list[StoreWorker],
) -> None:
    store = DictStore(1 << 24)
    full = _full("blocks_heads")
    stage0 = block_shards(HEADS, 1, 0, pp_size=2, pp_rank=0)
    _save(_worker(workers, store, _heads_of(full, "blocks_heads", stage0), stage0), (K1, 1))
    view = SharedStoreView(store, TierStats(), shards=stage0.per_block)
    assert view.count_prefix([K1]) == 0  # stage 1's layers are not there
    stage1 = block_shards(HEADS, 1, 0, pp_size=2, pp_rank=1)
    _save(_worker(workers, store, _heads_of(full, "blocks_heads", stage1), stage1), (K1, 1))
    assert view.count_prefix([K1]) == 1
    assert len(store) == 8 and all(store.contains(store_key(K1, s)) for s in range(8))


def test_mla_latents_are_one_shard_written_by_rank_zero(workers: list[StoreWorker]) -> None:
    store = DictStore(1 << 24)
    latent = {f"layer.{i}": torch.randn(NUM_BLOCKS, 16, 72) for i in range(2)}
    stats = [TierStats(), TierStats()]
    for rank in range(2):
        shards = block_shards(HEADS, 2, rank, split=False)
        _save(_worker(workers, store, latent, shards, stats[rank]), (K1, 1))
    assert [s.saved_blocks for s in stats] == [1, 0]
    entry = codec.decode(store.get(store_key(K1, 0)) or b"", NS, store_key(K1, 0))
    assert entry.layers[0].shape == (16, 72)


def test_a_layout_without_a_known_head_dimension_is_refused() -> None:
    worker = StoreWorker(DictStore(1 << 20), NS, 0, TierStats(), shards=block_shards(HEADS, 2, 0))
    try:
        with pytest.raises(UnsupportedLayout, match="head"):
            worker.register({"layer.0": torch.zeros(NUM_BLOCKS, 16, 64)}, NUM_BLOCKS)
        with pytest.raises(UnsupportedLayout, match="not this rank's 2"):
            worker.register({"layer.0": torch.zeros(NUM_BLOCKS, 4, 16, 64)}, NUM_BLOCKS)
    finally:
        worker.close()


@pytest.mark.parametrize(
    ("heads", "tp", "rank", "local", "writes"),
    [
        (4, 1, 0, (0, 1, 2, 3), True),
        (4, 2, 1, (2, 3), True),
        (2, 4, 3, (1,), False),
        (2, 4, 2, (1,), True),
        (8, 8, 5, (5,), True),
    ],
)
def test_block_shards_give_each_rank_its_heads(
    heads: int, tp: int, rank: int, local: tuple[int, ...], writes: bool
) -> None:
    shards = block_shards(heads, tp, rank)
    assert (shards.local, shards.writes, shards.per_block) == (local, writes, heads)


def test_block_shards_refuse_a_split_that_is_not_even() -> None:
    from kvmux.errors import ConfigError

    with pytest.raises(ConfigError, match="tensor_parallel_size"):
        block_shards(6, 4, 0)
    with pytest.raises(ConfigError, match="tensor_parallel_size"):
        block_shards(4, 6, 0)


def test_the_gpu_copy_path_moves_one_head_of_a_strided_view(layout: str) -> None:
    """HostSlab's and BlockMover's stream path (run on the host with RecordingStreams)
    over head views: a head's bytes in, the other heads untouched."""
    from kvmux.tier.worker.slab import HostSlab
    from kvmux.tier.worker.streams import RecordingStreams
    from kvmux.tier.worker.transfer import BlockMover, head_views

    full = _full(layout)
    source = [BlockMover(v, NUM_BLOCKS) for v in head_views(full, NUM_BLOCKS, HEADS)]
    slab = HostSlab(source, 4, RecordingStreams())
    slab.save(2, [1, 3], [0, 1])  # head 2 of blocks 1 and 3
    target = {name: torch.zeros_like(t) for name, t in full.items()}
    views = head_views(target, NUM_BLOCKS, HEADS)
    into = [BlockMover(v, NUM_BLOCKS, RecordingStreams()) for v in views]
    slab_in = HostSlab(into, 4, RecordingStreams())
    slab_in._slots.copy_(slab._slots)  # the same slot bytes, as a store would give back
    slab_in.load(2, [4, 5], [0, 1])
    entries = []
    for block in (1, 3):
        parts = [bytes(p) for p in source[2].block_parts(source[2].copy_out([block]), 0)]
        specs = source[2].layer_specs
        data = codec.encode(NS, b"k" * 16, specs, parts)
        entries.append(codec.decode(data, NS, b"k" * 16))
    into[1].copy_in_many([1, 2], entries)  # head 2's bytes into head 1, by the staged path
    _, axis = LAYOUTS[layout]
    for name, got in target.items():
        want = full[name]
        for dst, src in ((4, 1), (5, 3)):
            assert torch.equal(
                _block(got, layout, dst).narrow(axis - 1, 2, 1),
                _block(want, layout, src).narrow(axis - 1, 2, 1),
            )
        for dst, src in ((1, 1), (2, 3)):
            assert torch.equal(
                _block(got, layout, dst).narrow(axis - 1, 1, 1),
                _block(want, layout, src).narrow(axis - 1, 2, 1),
            )
        for head in (0, 3):
            assert not got.narrow(axis, head, 1).any()
