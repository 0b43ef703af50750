"""Reading inference requests before they are routed: checking and tokenizing them
(``prepare``), on the event loop or, for large ones, in child processes (``reader``,
``workers``, ``child``, ``wire``). Used by the front and by ``explain``."""
