"""Build the offline model directory Dynamo's frontend and mocker load (run in Dynamo's venv).

    <dynamo venv>/bin/python bench/peer/model.py DIR PROMPT

Writes ``tokenizer.json`` (a byte-level BPE trained here), ``tokenizer_config.json`` (special
tokens and a chat template), a small llama-style ``config.json`` and
``generation_config.json`` into DIR; no weights (the mocker needs none). Prints one JSON
line: the directory's sha256 and ``prompt_ids``, PROMPT as this tokenizer encodes it.

The tokenizer is trained on sentences of PROMPT's own words, so that each word is one token,
as each word is one token for dynamod's ``SimpleTokenizer``: the same prompt text is then
the same number of tokens, and the same number of KV blocks, on both stacks. Training is
single-threaded and the corpus comes from a fixed LCG, so two builds are byte-identical.

Runs with Dynamo's venv (it has ``tokenizers``); imports nothing from this repository.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

os.environ["RAYON_RS_NUM_CPUS"] = "1"  # one thread: a reproducible merge order
os.environ["TOKENIZERS_PARALLELISM"] = "false"

from tokenizers import (  # runs in Dynamo's venv (tokenizers is ours too, the [hf] extra)
    Tokenizer,
    decoders,
    models,
    pre_tokenizers,
    processors,
    trainers,
)

SPECIAL = ("<pad>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>")
PAD, BOS, EOS = SPECIAL[:3]
VOCAB_SIZE = 2048
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
FILES = ("tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json")


def corpus(words: list[str], lines: int = 3000) -> list[str]:
    """Sentences of ``words`` in a fixed pseudo-random order, plus every printable character."""
    out, state = [], 2026
    for i in range(lines):
        picked = []
        for _ in range(5 + i % 11):
            state = (state * 1103515245 + 12345) % (1 << 31)
            picked.append(words[state % len(words)])
        out.append(" ".join(picked) + f", {i}.")
    out.append("".join(chr(c) for c in range(32, 127)))
    return out


def train(words: list[str]) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(SPECIAL),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(words), trainer=trainer)
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return tokenizer


def configs(tokenizer: Tokenizer) -> dict[str, Mapping[str, object]]:
    ids = {name: tokenizer.token_to_id(name) for name in (PAD, BOS, EOS)}
    special = {"bos_token_id": ids[BOS], "eos_token_id": ids[EOS], "pad_token_id": ids[PAD]}
    added = {
        str(tokenizer.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False,
                                        "rstrip": False, "single_word": False, "special": True}
        for t in SPECIAL
    }  # fmt: skip
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "unk_token": None,
        "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
        "model_max_length": 8192, "chat_template": CHAT_TEMPLATE, "added_tokens_decoder": added,
    }  # fmt: skip
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": tokenizer.get_vocab_size(), "hidden_size": 256,
        "intermediate_size": 688, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 64, "hidden_act": "silu",
        "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16", **special,
    }  # fmt: skip
    return {"tokenizer_config.json": tokenizer_config, "config.json": config,
            "generation_config.json": special}  # fmt: skip


def build(out: Path, prompt: str) -> dict[str, object]:
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train(sorted(set(prompt.split())))
    tokenizer.save(str(out / "tokenizer.json"), pretty=False)
    for name, content in configs(tokenizer).items():
        (out / name).write_text(json.dumps(content, indent=2, sort_keys=True) + "\n")
    digest = hashlib.sha256()
    for name in FILES:
        digest.update(name.encode() + b"\0" + (out / name).read_bytes() + b"\0")
    ids = tokenizer.encode(prompt, add_special_tokens=False).ids
    return {"sha256": digest.hexdigest(), "prompt_ids": ids}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    print(json.dumps(build(Path(argv[0]), argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
