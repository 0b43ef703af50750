"""Prefix-cache hit rate and time to first token by routing mode (``python -m bench.prefix``).

``run`` drives it; ``chat`` is the workload; ``measure`` takes the figures; ``dynamo``
runs NVIDIA Dynamo 1.6.1 on the same workload; ``report`` writes RESULTS.md's section.
"""
