"""What a benchmark run measures: sizes of the quick and the full run."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DISK_CAPACITY", "ENTRY_BYTES", "FULL", "QUICK", "REDIS_MAXMEMORY", "BenchPlan"]

ENTRY_BYTES = 8 * 262144  # one 128-token block of the benchmark model, all layers (bf16)
DISK_CAPACITY = "4GiB"  # the full run's disk tier, page cache included, fits beside its engines
REDIS_MAXMEMORY = 4 * 10**9  # the full run's redis-server


@dataclass(frozen=True)
class BenchPlan:
    """Sizes of one run; the quick run is a smaller copy of the full one."""

    model_size: str  # kvmux.testing.models.MODEL_SIZES key
    dtype: str
    lengths: tuple[int, ...]  # workload (a): one long prompt of each length
    engine_blocks: int  # the engine's own KV cache, in blocks, for workloads (b) and (c)
    conversations: int  # workload (b): multi-turn conversations over one system prompt
    turns: int
    system_tokens: int
    user_tokens: int
    documents: int  # workload (b): RAG-style documents, each asked several questions
    questions: int
    document_tokens: int
    question_tokens: int
    noreuse_prompts: int  # workload (c)
    noreuse_tokens: int
    noreuse_max_tokens: int
    overhead_children: tuple[int, ...]  # MuxConnector overhead with this many children
    store_entries: int  # store microbenchmark: entries of one block each
    chat_conversations: int = 2  # workload (e): conversations per mode (replies saved or not)
    chat_turns: int = 5  # workload (e): turns of each, the model's replies fed back
    chat_user_tokens: int = 100  # workload (e): tokens of each user turn (system prompt apart)
    chat_reply_tokens: int = 160  # workload (e): tokens of each reply
    saving_rounds: int = 2  # workload (c): turns of each engine side by side (even: pairs count)
    saving_sessions: int = 1  # workload (c), vLLM's default layout: fresh engine pairs
    warm_repeats: int = 1  # workload (a): warm requests per prompt, their median reported
    warm_rounds: int = 2  # warm TTFT side by side (the bar): turns of each engine
    overhead_rounds: int = 1  # overhead: engine pairs (Mux, Multi) per children count
    disk_capacity: str = DISK_CAPACITY  # the one disk tier, filled before the workloads
    redis_maxmemory: int = REDIS_MAXMEMORY  # the Redis tier, filled before the workloads


QUICK = BenchPlan(
    model_size="tiny",
    dtype="bfloat16",
    lengths=(1024,),
    engine_blocks=12,
    conversations=3,
    turns=2,
    system_tokens=512,
    user_tokens=128,
    documents=3,
    questions=2,
    document_tokens=640,
    question_tokens=64,
    noreuse_prompts=8,
    noreuse_tokens=512,
    noreuse_max_tokens=16,
    overhead_children=(2,),
    store_entries=32,
    chat_conversations=1,
    chat_turns=3,
    chat_user_tokens=100,
    chat_reply_tokens=160,
    # the tiny model's workloads write a few MiB: tiers of 256 MB are as full, and evict
    # as a full tier does, for a sixteenth of the filling
    disk_capacity="256MiB",
    redis_maxmemory=256 * 10**6,
)

FULL = BenchPlan(
    model_size="bench",
    dtype="bfloat16",
    lengths=(1024, 4096, 8192),
    engine_blocks=48,
    conversations=6,
    turns=3,
    system_tokens=2048,
    user_tokens=256,
    documents=6,
    questions=3,
    document_tokens=1536,
    question_tokens=64,
    noreuse_prompts=16,
    noreuse_tokens=1024,
    noreuse_max_tokens=32,
    overhead_children=(1, 2, 4),
    store_entries=128,
    saving_rounds=4,
    saving_sessions=8,
    warm_repeats=3,
    warm_rounds=7,
    overhead_rounds=2,
    chat_conversations=2,
    chat_turns=5,
    chat_user_tokens=100,
    chat_reply_tokens=160,
)
