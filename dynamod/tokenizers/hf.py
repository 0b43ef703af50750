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

The template is code from the model's worker, so its render is bounded here, wherever it
runs: ``*``, ``+``, ``%`` and ``**`` are checked before they build a string, a sequence or
an integer larger than the limit (``'x' * 500000000`` is refused before a byte is taken),
the output is read piece by piece and refused past ``max_output`` characters, and
whatever the template raises becomes one ``TokenizerFailedError`` (its
``raise_exception``: ``TemplateRefusedError``, the request's refusal). CPU time and the
memory no operator check sees (a string doubled with ``~``, a filter's padding) are the
bounds of the process that renders it (``prompts/cpu_budget.py``, ``prompts/child.py``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Generator, Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import jinja2
import jinja2.ext
import jinja2.sandbox
from tokenizers import Tokenizer as RustTokenizer

from dynamod import jsoncodec
from dynamod.errors import InvalidInputError
from dynamod.tokenizers.base import (
    ChatMessage,
    TemplateRefusedError,
    TokenizerFailedError,
    bundle_checksum,
)
from dynamod.tokenizers.limits import TokenizerLimits

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"
FILES = (TOKENIZER_FILE, CONFIG_FILE, TEMPLATE_FILE, SPECIAL_TOKENS_FILE)
"""The files of a model directory that make its tokenizer; only ``tokenizer.json`` is
required."""
MAX_OUTPUT = TokenizerLimits.max_output
POWER_BITS = 1 << 16
"""The largest integer (in bits) a template's ``**`` may build."""
SHOWN = 300
"""Characters of a template's own error message kept in ours."""


class HfTokenizer:
    """A Hugging Face fast tokenizer and the model's chat template; see the module doc."""

    def __init__(self, files: Mapping[str, str], *, max_output: int = MAX_OUTPUT) -> None:
        if TOKENIZER_FILE not in files:
            raise InvalidInputError(f"a Hugging Face tokenizer needs {TOKENIZER_FILE}")
        self.files = dict(files)
        self.checksum = bundle_checksum(bundle_of(files))
        try:
            self._rust = RustTokenizer.from_str(files[TOKENIZER_FILE])
        except BaseException as exc:  # a bare Exception, or a Rust panic; others re-raised
            if not _from_library(exc):
                raise
            raise InvalidInputError(f"{TOKENIZER_FILE} does not load: {exc}") from None
        config = _config(files)
        self.bos_token = _token_text(config.get("bos_token"))
        self.eos_token = _token_text(config.get("eos_token"))
        self.chat_template = files.get(TEMPLATE_FILE) or _template_of(config)
        self.max_output = max_output
        template = self.chat_template
        self._template = _compile(template, max_output) if template else None

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
        return self._encode(text, special=True)

    def encode_chat(self, messages: Sequence[ChatMessage]) -> list[int]:
        return self._encode(self.render_chat(messages), special=False)

    def _encode(self, text: str, *, special: bool) -> list[int]:
        try:
            return list(self._rust.encode(text, add_special_tokens=special).ids)
        except BaseException as exc:  # a bare Exception, or a Rust panic; others re-raised
            if not _from_library(exc):
                raise
            raise TokenizerFailedError(f"its tokenizer failed: {_named(exc)}") from None

    def decode(self, ids: Iterable[int]) -> str:
        return str(self._rust.decode(list(ids), skip_special_tokens=True))

    def render_chat(self, messages: Sequence[ChatMessage]) -> str:
        """The chat template's text for ``messages``; ``TemplateRefusedError`` when the
        template refuses them, ``TokenizerFailedError`` for anything else it does."""
        if self._template is None:
            raise InvalidInputError(
                "this model's tokenizer has no chat template; use /v1/completions"
            )
        turns = [{"role": m.role, "content": m.content} for m in messages]
        try:
            return self._render(self._template, turns)
        except (TemplateRefusedError, TokenizerFailedError):
            raise
        except Exception as exc:  # noqa: BLE001 - a template may raise anything at all
            raise TokenizerFailedError(f"its chat template failed: {_named(exc)}") from None

    def _render(self, template: jinja2.Template, turns: list[dict[str, str]]) -> str:
        """The template's output, read piece by piece and refused past ``max_output``."""
        pieces: list[str] = []
        size = 0
        events = cast(
            Generator[str, None, None],
            template.generate(
                messages=turns,
                add_generation_prompt=True,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            ),
        )
        try:
            for piece in events:
                size += len(piece)
                if size > self.max_output:
                    raise TokenizerFailedError(
                        f"its chat template rendered more than {self.max_output} characters "
                        "for one request, the limit"
                    )
                pieces.append(piece)
        finally:
            events.close()
        return "".join(pieces)


def bundle_of(files: Mapping[str, str]) -> dict[str, Any]:
    """The published form of a Hugging Face tokenizer: its files, by name."""
    return {"kind": "hf", "files": {name: files[name] for name in sorted(files)}}


def _config(files: Mapping[str, str]) -> dict[str, Any]:
    """tokenizer_config.json, with special_tokens_map.json filling tokens it lacks."""
    config: dict[str, Any] = {}
    for name in (SPECIAL_TOKENS_FILE, CONFIG_FILE):
        if name in files:
            loaded = jsoncodec.read(files[name], name)
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


def _from_library(exc: BaseException) -> bool:
    """Whether ``exc`` is the tokenizers library's failure: a bare ``Exception``, or a Rust
    panic (pyo3's ``PanicException`` derives from ``BaseException``, so that a panic is not
    taken for an ordinary error; here it is one: the model's ``tokenizer.json`` made it)."""
    return isinstance(exc, Exception) or type(exc).__name__ == "PanicException"


def _named(exc: BaseException) -> str:
    """``Type: message`` of an error raised by the model's code, cut short."""
    text = str(exc)
    if len(text) > SHOWN:
        text = text[:SHOWN] + f"... ({len(text)} characters)"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _raise(message: object) -> None:
    text = str(message)
    raise TemplateRefusedError(
        f"its chat template refused the messages: {text[:SHOWN]}"
        + ("..." if len(text) > SHOWN else "")
    )


_SIZED = (str, bytes, list, tuple)
_WIDTH = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?")
"""A ``%`` conversion's width and precision."""


class _BoundedSandbox(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """jinja's immutable sandbox, whose ``*``, ``+``, ``%`` and ``**`` refuse to build a
    value larger than ``max_output`` characters (``POWER_BITS`` bits for an integer)."""

    intercepted_binops = frozenset({"*", "+", "%", "**"})

    def __init__(self, max_output: int, **options: Any) -> None:
        super().__init__(**options)
        self.max_output = max_output

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        integers = isinstance(left, int) and isinstance(right, int)
        limit, unit = (POWER_BITS, "bits") if integers else (self.max_output, "items")
        size = _result_size(operator, left, right)
        if size > limit:
            raise TokenizerFailedError(
                f"its chat template's {operator!r} would build a value of {size} {unit}, "
                f"over the limit of {limit}"
            )
        return super().call_binop(context, operator, left, right)


def _result_size(operator: str, left: Any, right: Any) -> int:
    """The size of ``left <operator> right`` before it is built: characters or items (bits
    for ``**``); 0 where the operation cannot grow past its operands."""
    if operator == "*":
        for seq, times in ((left, right), (right, left)):
            if isinstance(seq, _SIZED) and isinstance(times, int):
                return len(seq) * max(times, 0)
        if isinstance(left, int) and isinstance(right, int):
            return _bits(left, right)
    elif operator == "+" and isinstance(left, _SIZED) and isinstance(right, _SIZED):
        return len(left) + len(right)
    elif operator == "%" and isinstance(left, str):
        return _widest(left)
    elif operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0:
        return max(left.bit_length(), 1) * right
    return 0


def _bits(left: int, right: int) -> int:
    """The bits of ``left * right``, counted against ``POWER_BITS``: a product of large
    integers takes long in C, where no CPU timer can stop it; a small one counts as 0."""
    bits = left.bit_length() + right.bit_length()
    return bits if bits > POWER_BITS else 0


def _widest(form: str) -> int:
    """The largest width or precision of ``form``'s ``%`` conversions; a ``*`` (taken from
    the arguments) counts as unbounded."""
    widest = 0
    for match in _WIDTH.finditer(form):
        for value in match.groups():
            if value == "*":
                return 1 << 62
            if value:
                widest = max(widest, int(value))
    return widest


def _compile(source: str, max_output: int) -> jinja2.Template:
    environment = _BoundedSandbox(
        max_output, trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    # What transformers puts in a template's scope besides the messages.
    environment.filters["tojson"] = lambda value, indent=None: json.dumps(
        value, ensure_ascii=False, indent=indent
    )
    environment.globals["raise_exception"] = _raise
    environment.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return environment.from_string(source)
    except Exception as exc:  # noqa: BLE001 - a syntax error, or a template too deep to parse
        raise InvalidInputError(
            f"the model's chat template does not compile: {_named(exc)}"
        ) from None
