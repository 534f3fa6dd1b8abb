"""A small BPE tokenizer trained offline on local text, with a chat template.

Random-weight models have no tokenizer to download; servers need one for text prompts,
chat templates and ``vllm bench serve``. Trained on the vLLM package's own source files,
which every machine with vLLM has.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

__all__ = ["CHAT_TEMPLATE", "build_tokenizer"]

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
_SPECIALS = ["<unk>", "<s>", "</s>", "<|end|>", "<|user|>", "<|assistant|>", "<|system|>"]


def _corpus(limit_bytes: int = 4 << 20) -> Iterator[str]:
    """Text of the vLLM package's Python files, up to ``limit_bytes``."""
    import vllm

    root = Path(vllm.__file__).parent
    seen = 0
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(errors="ignore")
        seen += len(text)
        yield text
        if seen >= limit_bytes:
            return


def build_tokenizer(model_dir: Path, vocab_size: int) -> Path:
    """Train (once) a byte-level BPE of ``vocab_size`` tokens and save it in ``model_dir``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    stamp = model_dir / "kvmux-tokenizer.json"
    wanted = {"vocab_size": vocab_size, "template": CHAT_TEMPLATE}
    if stamp.exists() and json.loads(stamp.read_text()) == wanted:
        return model_dir
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="</s>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(model_dir)
    stamp.write_text(json.dumps(wanted))
    return model_dir
