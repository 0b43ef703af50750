"""dynamod against NVIDIA Dynamo 1.6.1 on one machine (``python -m bench.peer``).

``run`` drives it; ``venv`` builds Dynamo's cached venv; ``stacks`` and ``procs`` start
both stacks; ``measure`` and ``rows`` take the figures; ``report`` writes RESULTS.md's
section. ``model``, ``mocker`` and ``direct`` run as scripts inside Dynamo's venv.
"""
