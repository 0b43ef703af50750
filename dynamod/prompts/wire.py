"""What the daemon and its prompt processes say to each other, over the child's
stdin and stdout: frames of an 8-byte big-endian length and a pickle.

A job is a tuple whose first item names it (``OPS``); the answer is ``("ok", value)``,
``("error", exception)`` for a refusal the request gets (a ``FieldError``, a model's
tokenizer that failed or does not build, a fault of the process's own), or
``("need", checksum)`` when the worker does not hold that tokenizer yet: the daemon then
sends ``("tokenizer", checksum, raw)`` (the bundle's bytes,
``tokenizers.bundle.published``) and the job again.
Both ends are this program, so pickle is safe here; nothing from outside is unpickled.
"""

from __future__ import annotations

import pickle
from typing import Any, BinaryIO

OPS = ("head", "prepare", "tokenize", "tokenizer")
_LENGTH = 8


def encode(message: object) -> bytes:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return len(data).to_bytes(_LENGTH, "big") + data


def decode(data: bytes) -> Any:
    return pickle.loads(data)


def length(prefix: bytes) -> int:
    return int.from_bytes(prefix, "big")


def read_frame(stream: BinaryIO) -> bytes | None:
    """One frame from a blocking stream (the worker's side), or None at its end."""
    prefix = stream.read(_LENGTH)
    if len(prefix) < _LENGTH:
        return None
    data = stream.read(length(prefix))
    return data if len(data) == length(prefix) else None


PREFIX = _LENGTH
