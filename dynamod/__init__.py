"""dynamod: a control plane that routes LLM inference requests by worker taints."""

__version__ = "0.1.0"
