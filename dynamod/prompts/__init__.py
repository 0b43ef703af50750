"""Reading inference requests before they are routed: checking and tokenizing them
(``body``: ``read_head``, ``read_prompt``), on the event loop or, for large ones, in
child processes (``reader``, ``processes``, ``child``, ``wire``, ``cpu_budget``). Used by
the front and by ``explain``."""
