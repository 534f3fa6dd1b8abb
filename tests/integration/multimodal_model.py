"""A tiny random-weight Idefics3 (SigLIP-like vision tower + Llama) built offline.

Idefics3 rather than Llava, PaliGemma or Qwen2-VL: the CPU venv has no torchvision (PyPI's
does not import beside torch 2.13+cpu), and for those models vLLM 0.32 imports
``transformers``' torchvision-only image processors (Llava and PaliGemma through vLLM's
``get_vision_encoder_info``, which imports Pixtral's). Idefics3 runs with
``transformers``' PIL image processor. Its image placeholder replaces ``<image>`` where it
stands in the prompt, so text can surround it.

Also a script: ``python -m tests.integration.multimodal_model JOB.json`` runs one vLLM
engine on such a model with image prompts, in its own process, and prints one JSON
document on its last stdout line (after ``RESULT_MARK``). The job is
``{"model": dir, "engine": {...}, "kv": {...} | None, "steps": [...]}``; each step is
``{"prompt": text, "image_seed": s, "max_tokens": n}`` and its result has the generated
``tokens``, their ``logprobs``, ``num_cached_tokens``, the ``prompt_token_ids`` vLLM
built and ``image_span``, the [start, end) of the image's placeholder tokens in them (what
vLLM keys by the image's hash). ``run_multimodal_job`` runs the script from a test.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from kvmux.testing.engine import run_engine_job
from kvmux.testing.runner import RESULT_MARK, sampled_logprobs

__all__ = [
    "IMAGE_SIDE",
    "IMAGE_TOKEN",
    "IMAGE_TOKENS",
    "build_tiny_idefics3",
    "random_image",
    "run_multimodal_job",
]

IMAGE_TOKEN = "<image>"
IMAGE_SIDE = 128  # pixels, one tile (no image splitting)
PATCH = 4  # 32 x 32 patches, merged 2 x 2 by the connector: 256 image tokens
SCALE = 2
IMAGE_TOKENS = (IMAGE_SIDE // PATCH) ** 2 // SCALE**2
SPECIAL_TOKENS = [
    "<unk>",
    "<s>",
    "</s>",
    "<pad>",
    "<fake_token_around_image>",
    IMAGE_TOKEN,
    "<end_of_utterance>",
    "<global-img>",
]
_STAMP = "kvmux-idefics3.json"
_VERSION = 1


def _training_text() -> list[str]:
    """Local text to train the tokenizer on: some of vLLM's own sources."""
    import vllm

    root = Path(vllm.__file__).parent
    return [p.read_text(errors="ignore") for p in sorted(root.glob("*.py"))[:40]]


def _build_tokenizer(vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_training_text(), trainer=trainer)
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
    )


def build_tiny_idefics3(path: Path, seed: int = 0) -> Path:
    """Build (once) a float32 random Idefics3 with tokenizer and processor at ``path``."""
    import torch
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessor,
        Idefics3Processor,
        Idefics3VisionConfig,
        LlamaConfig,
    )

    stamp = path / _STAMP
    wanted = {"version": _VERSION, "seed": seed}
    if stamp.exists() and json.loads(stamp.read_text()) == wanted:
        return path
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = _build_tokenizer(vocab_size=1024)
    image_processor = Idefics3ImageProcessor(
        do_image_splitting=False,
        size={"longest_edge": IMAGE_SIDE},
        max_image_size={"longest_edge": IMAGE_SIDE},
    )
    processor = Idefics3Processor(
        image_processor=image_processor, tokenizer=tokenizer, image_seq_len=IMAGE_TOKENS
    )
    vision = Idefics3VisionConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=IMAGE_SIDE,
        patch_size=PATCH,
    )
    text = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    config = Idefics3Config(
        vision_config=vision,
        text_config=text,
        image_token_id=processor.image_token_id,
        scale_factor=SCALE,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Idefics3ForConditionalGeneration(config)  # type: ignore[no-untyped-call]
    assert model.dtype == torch.float32
    model.save_pretrained(path)
    processor.save_pretrained(path)
    stamp.write_text(json.dumps(wanted))
    return path


def random_image(seed: int) -> Any:
    """A reproducible random RGB image of IMAGE_SIDE x IMAGE_SIDE pixels."""
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (IMAGE_SIDE, IMAGE_SIDE, 3))
    return Image.fromarray(pixels.astype("uint8"), "RGB")


def run(job: dict[str, Any]) -> dict[str, Any]:
    """Start one engine on the job's model; run each step's image prompt in turn."""
    from vllm import LLM, SamplingParams, TextPrompt
    from vllm.config import KVTransferConfig

    kwargs = {"enforce_eager": True, "max_model_len": 4096, "seed": 0, **job.get("engine", {})}
    if job.get("kv") is not None:
        kwargs["kv_transfer_config"] = KVTransferConfig(**job["kv"])
    llm = LLM(model=job["model"], **kwargs)
    fake = llm.get_tokenizer().convert_tokens_to_ids("<fake_token_around_image>")
    results = []
    for step in job["steps"]:
        params = SamplingParams(temperature=0, max_tokens=step.get("max_tokens", 8), logprobs=0)
        image = random_image(int(step["image_seed"]))
        prompt = TextPrompt(prompt=step["prompt"], multi_modal_data={"image": image})
        (out,) = llm.generate([prompt], params, use_tqdm=False)
        ids = list(out.prompt_token_ids or [])
        around = [i for i, token in enumerate(ids) if token == fake]
        results.append(
            {
                "tokens": list(out.outputs[0].token_ids),
                "logprobs": sampled_logprobs(out.outputs[0]),
                "num_cached_tokens": int(out.num_cached_tokens or 0),
                "prompt_token_ids": ids,
                "image_span": [around[0], around[-1] + 1],
            }
        )
    return {"steps": results}


def run_multimodal_job(
    job: dict[str, Any], env: dict[str, str] | None = None, timeout: float = 600
) -> dict[str, Any]:
    """Run ``job`` with this module as a script in a fresh process; return its result."""
    return run_engine_job(
        job,
        env=env,
        timeout=timeout,
        module="tests.integration.multimodal_model",
        cwd=Path(__file__).resolve().parents[2],  # where ``tests`` is importable
    )


if __name__ == "__main__":
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if sys.argv[1] == "build":
        print(build_tiny_idefics3(Path(sys.argv[2])))
    else:
        result = run(json.loads(Path(sys.argv[1]).read_text()))
        print(RESULT_MARK + json.dumps(result), flush=True)
