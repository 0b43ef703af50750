"""Tokenizers: the contract (``base``), the mocker's deterministic one (``simple``), a
model's own Hugging Face one (``hf``, the ``hf`` extra; import it from its module), and how
a worker publishes its tokenizer for the daemon (``bundle``)."""

from dynamod.tokenizers.base import ChatMessage, Tokenizer
from dynamod.tokenizers.simple import SimpleTokenizer

__all__ = ["ChatMessage", "SimpleTokenizer", "Tokenizer"]
