"""The OpenAI-compatible HTTP front: requests in, routed to workers, answers relayed back.

``front.py`` holds the ``Frontend`` (routes, drain, retry); ``body.py`` reads a request,
``relay.py`` talks to one worker, ``replies.py`` shapes the front's own answers.
"""

from dynamod.frontend.front import WORKERS_TRIED, Frontend
from dynamod.frontend.front_metrics import FrontendMetrics

__all__ = ["WORKERS_TRIED", "Frontend", "FrontendMetrics"]
