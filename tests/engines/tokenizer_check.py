"""Run by the engines venv's Python: dynamod's own reading of a model's tokenizer files
(tokenizers + jinja2) against transformers' AutoTokenizer, which vLLM uses.

    python tests/engines/tokenizer_check.py MODEL_DIR TEXT... → one JSON line of verdicts
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from transformers import AutoTokenizer

from dynamod.tokenizers import ChatMessage
from dynamod.tokenizers.hf import HfTokenizer


def main() -> None:
    directory, texts = Path(sys.argv[1]), sys.argv[2:]
    ref, ours = AutoTokenizer.from_pretrained(str(directory)), HfTokenizer.from_directory(directory)
    chat = [{"role": "system", "content": "be terse"}, {"role": "user", "content": "hello there"}]
    turns = [ChatMessage(**m) for m in chat]
    rendered = ref.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    verdicts = {
        "texts": [ref.encode(t) == ours.encode(t) for t in texts],
        "render": rendered == ours.render_chat(turns),
        "chat": ref.encode(rendered, add_special_tokens=False) == ours.encode_chat(turns),
    }
    print(json.dumps(verdicts))


if __name__ == "__main__":
    main()
