"""How a worker publishes its tokenizer and a daemon gets it back.

The worker serves its tokenizer's *bundle* (canonical JSON) on its system port at
``GET /engine/tokenizer`` and names it in its model card, under ``tokenizer``::

    "tokenizer": {"kind": "hf", "path": "/engine/tokenizer", "checksum": "sha256:…"}

so ``mdcsum`` covers it (workers with different tokenizers are not interchangeable). A
bundle is ``{"kind": "simple", "version": 1}`` (the mocker's ``SimpleTokenizer``) or
``{"kind": "hf", "files": {"tokenizer.json": …, "tokenizer_config.json": …}}`` (a model's
own; see ``hf.py``). ``checksum`` is the sha256 of the bundle's canonical JSON, checked
by ``load`` before anything is built from it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Protocol

from dynamod.errors import InvalidInputError
from dynamod.records import ModelCard, canonical_json
from dynamod.tokenizers.base import Tokenizer, bundle_checksum
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
    """The bytes a worker serves at ``PATH``: the bundle's canonical JSON."""
    return canonical_json(tokenizer.bundle())


def load(raw: bytes, checksum: str) -> Tokenizer:
    """The tokenizer in a fetched bundle, once its checksum matches ``checksum``."""
    try:
        bundle = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TokenizerUnavailableError(f"the tokenizer bundle is not JSON: {exc}") from None
    if not isinstance(bundle, dict):
        raise TokenizerUnavailableError("the tokenizer bundle must be a JSON object")
    found = bundle_checksum(bundle)
    if found != checksum:
        raise TokenizerUnavailableError(
            f"the tokenizer bundle's checksum is {found}, the model card says {checksum}"
        )
    return from_bundle(bundle)


def from_bundle(bundle: dict[str, Any]) -> Tokenizer:
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
            raise TokenizerUnavailableError(
                f"this model publishes a Hugging Face tokenizer, which needs the hf extra "
                f"(pip install 'dynamod[hf]'): {exc}"
            ) from None
        return HfTokenizer(files)
    raise TokenizerUnavailableError(
        f"unknown tokenizer bundle kind {kind!r}; known: {', '.join(KINDS)}"
    )


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
