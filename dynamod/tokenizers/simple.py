"""A simple deterministic tokenizer, so token counts and KV block hashes mean something.

This is **not** a real model tokenizer and makes no claim to match any model's token
counts. It exists for the mocker engine, which needs prompts turned into stable token ids
(equal text, equal ids, in every process and on every machine) and generated ids turned
back into readable text:

* ``encode`` splits text into words and single punctuation marks. A piece found in the
  fixed vocabulary ``VOCABULARY`` gets its index there; any other piece gets a stable
  hash-derived id in ``[len(VOCABULARY), VOCAB_SIZE)``. Python's ``hash()`` is never used:
  it is salted per process.
* ``decode`` maps every id onto the vocabulary (``id % len(VOCABULARY)``), each piece with
  a leading space, so streamed pieces concatenate into words. It inverts ``encode`` only
  for text written in vocabulary words; hashed ids come back as some vocabulary word.
* ``render_chat`` is the chat template: a fixed text layout of the messages that ends with
  the assistant's turn marker; ``encode_chat`` encodes it.
* its published form (``bundle.py``) is ``{"kind": "simple", "version": 1}``: a daemon
  rebuilds it from that, so the mocker's tokenizer reaches the front by the same path as a
  real model's.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence

from dynamod.tokenizers.base import ChatMessage, bundle_checksum

BUNDLE = {"kind": "simple", "version": 1}

VOCAB_SIZE = 50_000

_WORDS = """
    the of and to in a is that for it as was with be by on not he this are or his from
    at which but have an had they you were their one all we can her has there been if
    more when will would who so no time out up about into than them only other new some
    could these two may first then do any like my now over such our man me even most
    made after also did many before must through back years where much your way well
    down should because each just those people how too little state good very make world
    still own see men work long get here between both life being under never day same
    another know while last might us great old year off come since against go came right
    used take three light river stone cloud garden signal engine token block cache route
    worker model query answer quiet bright open green north south east west morning
    evening window mountain harbor
"""
VOCABULARY: tuple[str, ...] = tuple(_WORDS.split())

_PIECES = re.compile(r"\w+|[^\w\s]")
_INDEX = {word: i for i, word in enumerate(VOCABULARY)}


class SimpleTokenizer:
    """Words and punctuation to stable ids, and ids back to vocabulary words."""

    vocab_size = VOCAB_SIZE

    checksum = bundle_checksum(BUNDLE)

    def bundle(self) -> dict[str, object]:
        return dict(BUNDLE)

    def encode(self, text: str) -> list[int]:
        return [_piece_id(piece) for piece in _PIECES.findall(text)]

    def encode_chat(self, messages: Sequence[ChatMessage]) -> list[int]:
        return self.encode(self.render_chat(messages))

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(" " + VOCABULARY[i % len(VOCABULARY)] for i in ids)

    def render_chat(self, messages: Sequence[ChatMessage]) -> str:
        turns = "".join(f"<|{m.role}|>\n{m.content}\n" for m in messages)
        return turns + "<|assistant|>\n"


def _piece_id(piece: str) -> int:
    known = _INDEX.get(piece)
    if known is not None:
        return known
    digest = hashlib.blake2b(piece.encode(), digest_size=8).digest()
    return len(VOCABULARY) + int.from_bytes(digest, "big") % (VOCAB_SIZE - len(VOCABULARY))
