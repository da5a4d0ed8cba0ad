"""elastra_worker: the in-pod runtime of an Elastra training job.

It turns the assignment the operator writes into a torch.distributed world, checkpoints and
reshards across world sizes, and keeps the data order independent of the world size. It never
imports ``elastra`` and never talks to the Kubernetes API: a worker needs no credentials.
"""
