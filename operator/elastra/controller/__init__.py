"""The operator's controller, in two layers (``docs/architecture.md`` draws every module).

``engine`` does the I/O: Kopf's handlers, the informers and the cluster snapshot they fill, one
loop per job, the Lease, Events, metrics. ``decide`` is pure: from what the engine observed it
computes one pass (``decide.passplan.plan_pass``): the status to write, the pods to create and
delete. ``settings`` is the operator's configuration both read. Import contracts in
``pyproject.toml`` keep ``decide`` free of API calls and of the engine.
"""
