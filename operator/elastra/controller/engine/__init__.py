"""The controller's I/O: Kopf's handlers, informers and the snapshot they keep, one loop per
job that runs ``decide.passplan.plan_pass`` and applies its plan through ``elastra.kube``, the
Lease, node warnings, progress reads and metrics."""
