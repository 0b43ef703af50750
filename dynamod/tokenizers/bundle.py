"""How a worker publishes its tokenizer and a daemon gets it back.

The worker serves its tokenizer's *bundle* (canonical JSON) on its system port at
``GET /engine/tokenizer`` and names it in its model card, under ``tokenizer``::

    "tokenizer": {"kind": "hf", "path": "/engine/tokenizer", "checksum": "sha256:…"}

so ``mdcsum`` covers it (workers with different tokenizers are not interchangeable). A
bundle is ``{"kind": "simple", "version": 1}`` (the mocker's ``SimpleTokenizer``) or
``{"kind": "hf", "files": {"tokenizer.json": …, "tokenizer_config.json": …}}`` (a model's
own; see ``hf.py``). ``checksum`` is the sha256 of the bundle's canonical JSON, checked
by ``load`` before anything is built from it.

A model's own tokenizer is code the daemon did not write (its ``tokenizer.json`` pipeline,
its Jinja chat template), so the daemon never builds one in its own process: ``received``
checks a fetched bundle's bytes against the card's checksum (a hash, no parsing) and gives
a ``BundledTokenizer``, which holds those bytes; the daemon's prompt processes build and
run it, bounded (``dynamod/prompts``). The mocker's ``SimpleTokenizer`` is this project's
own code and is built anywhere.
"""

from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from dynamod import jsoncodec
from dynamod.errors import InvalidInputError
from dynamod.records import ModelCard
from dynamod.tokenizers.base import ChatMessage, Tokenizer, bundle_checksum
from dynamod.tokenizers.limits import TokenizerLimits
from dynamod.tokenizers.simple import BUNDLE as SIMPLE_BUNDLE
from dynamod.tokenizers.simple import SimpleTokenizer

PATH = "/engine/tokenizer"
CARD_FIELD = "tokenizer"
KINDS = ("simple", "hf")


class TokenizerUnavailableError(InvalidInputError):
    """A bundle this process cannot load: a bad checksum or body, or a missing extra."""


class Publishable(Tokenizer, Protocol):
    """A tokenizer a worker can publish: it knows its own bundle."""

    def bundle(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class TokenizerRef:
    """Where a model card says its tokenizer is: ``path`` on the worker's system address,
    what ``kind`` it is, and the ``checksum`` of its bundle."""

    kind: str
    checksum: str
    path: str = PATH

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "path": self.path, "checksum": self.checksum}

    @classmethod
    def of(cls, card: ModelCard) -> TokenizerRef | None:
        """The card's reference, or None for a card that publishes none (an older worker)."""
        obj = card.extra.get(CARD_FIELD)
        if not isinstance(obj, dict):
            return None
        kind, path, checksum = obj.get("kind"), obj.get("path"), obj.get("checksum")
        if not all(isinstance(v, str) for v in (kind, path, checksum)):
            return None
        return cls(str(kind), str(checksum), str(path))

    @classmethod
    def of_tokenizer(cls, tokenizer: Publishable) -> TokenizerRef:
        kind = str(tokenizer.bundle()["kind"])
        return cls(kind, tokenizer.checksum)


def with_tokenizer(card: ModelCard, tokenizer: Publishable) -> ModelCard:
    """``card`` naming ``tokenizer`` as the one its worker publishes."""
    extra = {**card.extra, CARD_FIELD: TokenizerRef.of_tokenizer(tokenizer).to_json()}
    return replace(card, extra=extra)


def published(tokenizer: Publishable) -> bytes:
    """The bytes a worker serves at ``PATH``: the bundle's canonical JSON (for a
    ``BundledTokenizer``, the very bytes it was received as)."""
    if isinstance(tokenizer, BundledTokenizer):
        return tokenizer.raw
    return jsoncodec.canonical(tokenizer.bundle())


def load(raw: bytes, checksum: str, *, max_output: int = TokenizerLimits.max_output) -> Tokenizer:
    """The tokenizer in a fetched bundle, once its checksum matches ``checksum``; a chat
    template renders at most ``max_output`` characters (``hf.py``)."""
    try:
        bundle = jsoncodec.read(raw, "the tokenizer bundle")
    except InvalidInputError as exc:
        raise TokenizerUnavailableError(str(exc)) from None
    if not isinstance(bundle, dict):
        raise TokenizerUnavailableError("the tokenizer bundle must be a JSON object")
    found = bundle_checksum(bundle)
    if found != checksum:
        raise TokenizerUnavailableError(
            f"the tokenizer bundle's checksum is {found}, the model card says {checksum}"
        )
    return from_bundle(bundle, max_output=max_output)


def from_bundle(
    bundle: dict[str, Any], *, max_output: int = TokenizerLimits.max_output
) -> Tokenizer:
    kind = bundle.get("kind")
    if kind == "simple" and bundle == SIMPLE_BUNDLE:
        return SimpleTokenizer()
    if kind == "hf" and isinstance(bundle.get("files"), dict):
        files = bundle["files"]
        if not all(isinstance(v, str) for v in files.values()):
            raise TokenizerUnavailableError("a Hugging Face bundle's files must be strings")
        try:
            from dynamod.tokenizers.hf import HfTokenizer
        except ImportError as exc:
            raise TokenizerUnavailableError(_NEEDS_EXTRA.format(exc)) from None
        try:
            return HfTokenizer(files, max_output=max_output)
        except InvalidInputError as exc:
            raise TokenizerUnavailableError(str(exc)) from None
    raise TokenizerUnavailableError(
        f"unknown tokenizer bundle kind {kind!r}; known: {', '.join(KINDS)}"
    )


_NEEDS_EXTRA = (
    "this model publishes a Hugging Face tokenizer, which needs the hf extra "
    "(pip install 'dynamod[hf]'): {}"
)


def received(raw: bytes, ref: TokenizerRef) -> Tokenizer:
    """The tokenizer a fetched bundle holds, checked against ``ref`` without building a
    model's own: ``SimpleTokenizer`` for the mocker's bundle, else a ``BundledTokenizer``
    holding ``raw``. ``raw`` must be the bundle's canonical JSON, as workers serve it (its
    sha256 is the card's checksum). Hashing releases the GIL: call it in a thread for a
    large bundle."""
    found = "sha256:" + hashlib.sha256(raw).hexdigest()
    if found != ref.checksum:
        raise TokenizerUnavailableError(
            f"the tokenizer bundle's bytes hash to {found[:19]}..., the model card says "
            f"{ref.checksum[:19]}... (a worker serves its bundle's canonical JSON)"
        )
    if raw == published(SimpleTokenizer()):
        return SimpleTokenizer()
    if ref.kind != "hf":
        raise TokenizerUnavailableError(
            f"unknown tokenizer bundle kind {ref.kind!r}; known: {', '.join(KINDS)}"
        )
    if not _hf_installed():
        raise TokenizerUnavailableError(_NEEDS_EXTRA.format("tokenizers or jinja2 is missing"))
    return BundledTokenizer(ref.kind, ref.checksum, raw)


def _hf_installed() -> bool:
    return all(importlib.util.find_spec(name) for name in ("tokenizers", "jinja2"))


@dataclass
class BundledTokenizer:
    """A model's own tokenizer as the daemon holds it: its bundle's bytes, checked against
    the card's checksum (``received``), and nothing built from them.

    The daemon's prompt reader sends ``raw`` to its prompt processes, which build and run
    the tokenizer there, bounded (``dynamod/prompts``); it never calls the methods below.
    They build the tokenizer in this process on first use, for tools and tests that trust
    it."""

    kind: str
    checksum: str
    raw: bytes
    _built: Tokenizer | None = field(default=None, init=False, repr=False, compare=False)

    def bundle(self) -> dict[str, Any]:
        bundle: dict[str, Any] = jsoncodec.read(self.raw, "the tokenizer bundle")  # type: ignore[assignment]
        return bundle

    def _here(self) -> Tokenizer:
        if self._built is None:
            self._built = load(self.raw, self.checksum)
        return self._built

    @property
    def vocab_size(self) -> int:
        return self._here().vocab_size

    def encode(self, text: str) -> list[int]:
        return self._here().encode(text)

    def encode_chat(self, messages: Sequence[ChatMessage]) -> list[int]:
        return self._here().encode_chat(messages)

    def decode(self, ids: Iterable[int]) -> str:
        return self._here().decode(ids)

    def render_chat(self, messages: Sequence[ChatMessage]) -> str:
        return self._here().render_chat(messages)


class Tokenizers(Protocol):
    """Where the front (and ``explain``) find the tokenizer of a model's workers."""

    async def for_card(self, card: ModelCard) -> Tokenizer:
        """The tokenizer ``card`` publishes; an approximate one when it cannot be had."""
        ...


@dataclass(frozen=True)
class Fixed:
    """One tokenizer for every model: the in-memory ``Tokenizers``, for tests and tools
    that know their workers' tokenizer."""

    tokenizer: Tokenizer

    async def for_card(self, card: ModelCard) -> Tokenizer:
        return self.tokenizer
