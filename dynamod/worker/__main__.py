"""``python -m dynamod.worker``: the ``dynamo-worker`` command.

vLLM starts its engine core in *spawned* processes, which import this module again as
``__mp_main__``: the guard keeps them from running a worker of their own, and this module
imports nothing else at the top so that they start light.
"""

if __name__ == "__main__":
    from dynamod.worker.main import main

    main()
