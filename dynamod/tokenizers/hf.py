"""A model's own Hugging Face tokenizer, from its ``tokenizer.json`` and chat template.

Built on the ``tokenizers`` library (the Rust tokenizer transformers itself wraps) and
``jinja2`` for the chat template, without transformers or torch, so the daemon can load
it: both come with the ``hf`` extra (``pip install 'dynamod[hf]'``). The only module that
imports them (a ruff ban keeps it so).

It reads prompts as vLLM's OpenAI server does:

* a completion prompt is encoded with the tokenizer's special tokens (the post-processor
  in ``tokenizer.json`` adds a leading BOS where the model wants one);
* a chat is rendered with the chat template (``bos_token``, ``eos_token`` and
  ``add_generation_prompt=True`` in scope, as transformers renders it: a sandboxed jinja2
  environment with ``trim_blocks`` and ``lstrip_blocks``), and the text is encoded
  *without* adding special tokens again, since the template writes them.

A tokenizer is made from its bundle (``bundle.py``): the files a worker publishes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox
from tokenizers import Tokenizer as RustTokenizer

from dynamod.errors import InvalidInputError
from dynamod.tokenizers.base import ChatMessage, bundle_checksum

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"
FILES = (TOKENIZER_FILE, CONFIG_FILE, TEMPLATE_FILE, SPECIAL_TOKENS_FILE)
"""The files of a model directory that make its tokenizer; only ``tokenizer.json`` is
required."""


class HfTokenizer:
    """A Hugging Face fast tokenizer and the model's chat template; see the module doc."""

    def __init__(self, files: Mapping[str, str]) -> None:
        if TOKENIZER_FILE not in files:
            raise InvalidInputError(f"a Hugging Face tokenizer needs {TOKENIZER_FILE}")
        self.files = dict(files)
        self.checksum = bundle_checksum(bundle_of(files))
        try:
            self._rust = RustTokenizer.from_str(files[TOKENIZER_FILE])
        except Exception as exc:  # noqa: BLE001 - the library raises a bare Exception
            raise InvalidInputError(f"{TOKENIZER_FILE} does not load: {exc}") from None
        config = _config(files)
        self.bos_token = _token_text(config.get("bos_token"))
        self.eos_token = _token_text(config.get("eos_token"))
        self.chat_template = files.get(TEMPLATE_FILE) or _template_of(config)
        self._template = _compile(self.chat_template) if self.chat_template else None

    @classmethod
    def from_directory(cls, directory: Path) -> HfTokenizer:
        """The tokenizer of a model directory (``FILES``, those present)."""
        files = {n: (directory / n).read_text() for n in FILES if (directory / n).is_file()}
        if TOKENIZER_FILE not in files:
            raise InvalidInputError(
                f"{str(directory)!r} has no {TOKENIZER_FILE}: only fast (tokenizer.json) "
                "Hugging Face tokenizers are supported"
            )
        return cls(files)

    def bundle(self) -> dict[str, Any]:
        return bundle_of(self.files)

    @property
    def vocab_size(self) -> int:
        return int(self._rust.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> list[int]:
        return list(self._rust.encode(text, add_special_tokens=True).ids)

    def encode_chat(self, messages: Sequence[ChatMessage]) -> list[int]:
        rendered = self.render_chat(messages)
        return list(self._rust.encode(rendered, add_special_tokens=False).ids)

    def decode(self, ids: Iterable[int]) -> str:
        return str(self._rust.decode(list(ids), skip_special_tokens=True))

    def render_chat(self, messages: Sequence[ChatMessage]) -> str:
        if self._template is None:
            raise InvalidInputError(
                "this model's tokenizer has no chat template; use /v1/completions"
            )
        turns = [{"role": m.role, "content": m.content} for m in messages]
        try:
            return self._template.render(
                messages=turns,
                add_generation_prompt=True,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except jinja2.TemplateError as exc:
            raise InvalidInputError(
                f"the model's chat template refused the messages: {exc}"
            ) from None


def bundle_of(files: Mapping[str, str]) -> dict[str, Any]:
    """The published form of a Hugging Face tokenizer: its files, by name."""
    return {"kind": "hf", "files": {name: files[name] for name in sorted(files)}}


def _config(files: Mapping[str, str]) -> dict[str, Any]:
    """tokenizer_config.json, with special_tokens_map.json filling tokens it lacks."""
    config: dict[str, Any] = {}
    for name in (SPECIAL_TOKENS_FILE, CONFIG_FILE):
        if name in files:
            try:
                loaded = json.loads(files[name])
            except json.JSONDecodeError as exc:
                raise InvalidInputError(f"{name} is not valid JSON: {exc}") from None
            if not isinstance(loaded, dict):
                raise InvalidInputError(f"{name} must hold a JSON object")
            config |= loaded
    return config


def _token_text(token: object) -> str:
    """A special token as configured: a string, or an AddedToken object with ``content``."""
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) else ""


def _template_of(config: Mapping[str, Any]) -> str | None:
    """The chat template: a string, or the ``default`` of a list of named templates."""
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


def _compile(source: str) -> jinja2.Template:
    environment = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    # What transformers puts in a template's scope besides the messages.
    environment.filters["tojson"] = lambda value, indent=None: json.dumps(
        value, ensure_ascii=False, indent=indent
    )
    environment.globals["raise_exception"] = _raise
    environment.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return environment.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise InvalidInputError(f"the model's chat template does not compile: {exc}") from None
