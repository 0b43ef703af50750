"""Build a tiny random-weight Llama with its own tokenizer, offline, in seconds.

    ~/.cache/dynamod/engines-venv/bin/python scripts/tiny_model.py OUT_DIR [--seed 0]

For the real-engine tests, ``dynamod demo --engine vllm`` and the GPU check: a model
directory vLLM serves (``config.json``, ``model.safetensors``, ``generation_config.json``,
``tokenizer.json``, ``tokenizer_config.json`` with its chat template), about 6 MB.
Nothing is downloaded: the byte-level BPE tokenizer (vocabulary 512; ``<s>`` = 0,
``</s>`` = 1, ``<pad>`` = 2) is trained on a corpus generated from a fixed word list, and
the weights are drawn from a seeded generator, so a seed gives the same files every time
with the same library versions. Needs torch, transformers and tokenizers (the engines
venv has them).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse
import random
import sys
from pathlib import Path
from typing import Any

VOCAB = 512
BOS, EOS, PAD = "<s>", "</s>", "<pad>"
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
WORDS = [
    "the",
    "a",
    "of",
    "to",
    "in",
    "and",
    "is",
    "for",
    "on",
    "with",
    "as",
    "by",
    "at",
    "from",
    "that",
    "this",
    "it",
    "model",
    "request",
    "worker",
    "router",
    "cache",
    "block",
    "token",
    "prefix",
    "engine",
    "server",
    "client",
    "stream",
    "prompt",
    "reply",
    "chat",
    "system",
    "user",
    "assistant",
    "hello",
    "world",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "one",
    "two",
    "three",
    "four",
    "five",
    "red",
    "green",
    "blue",
    "north",
    "south",
    "east",
    "west",
    "time",
    "data",
    "load",
    "queue",
    "batch",
    "river",
    "stone",
    "bridge",
]


def corpus(seed: int) -> list[str]:
    rng = random.Random(seed)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 16))) for _ in range(2000)]
    return [*lines, "<|system|>", "<|user|>", "<|assistant|>", "0123456789", "Hello, world!"]


def tokenizer(seed: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=[BOS, EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(corpus(seed), trainer=trainer)
    # A leading <s> when special tokens are added, as Llama tokenizers do.
    bpe.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bpe.token_to_id(BOS))]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token=BOS, eos_token=EOS, pad_token=PAD, model_max_length=2048
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build(directory: Path, seed: int = 0) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    directory.mkdir(parents=True, exist_ok=True)
    tok = tokenizer(seed)
    ids = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}
    ids["pad_token_id"] = tok.pad_token_id
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        **ids,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    model.generation_config = GenerationConfig(do_sample=False, **ids)
    model.save_pretrained(directory, safe_serialization=True)
    # Keep the chat template inside tokenizer_config.json (transformers 5 would otherwise
    # write chat_template.jinja; dynamod reads both).
    tok.save_pretrained(directory, save_jinja_files=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    build(args.directory, args.seed)
    print(f"tiny model in {args.directory}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
