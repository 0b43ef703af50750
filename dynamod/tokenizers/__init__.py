"""Tokenizers: the contract (``base``) and the mocker's deterministic one (``simple``)."""

from dynamod.tokenizers.base import ChatMessage, Tokenizer
from dynamod.tokenizers.simple import SimpleTokenizer

__all__ = ["ChatMessage", "SimpleTokenizer", "Tokenizer"]
