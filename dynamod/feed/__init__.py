"""What workers report about their engines, as the daemon receives it.

``Feeds`` follows each worker's engine events stream (its load and health, pushed by the
worker: ``dynamod.reported``) and hands every state to the router; ``TokenizerRegistry``
fetches and caches the tokenizer each model's workers publish, for the front and
``explain``. The daemon owns both.
"""

from dynamod.feed.feeds import Feeds
from dynamod.feed.tokenizers import TokenizerRegistry

__all__ = ["Feeds", "TokenizerRegistry"]
