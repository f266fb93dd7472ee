"""Acting on gangwatch's decisions from outside the worker.

The reference job controller (`controller`: launches a torchrun job with `launcher` and carries out its actions,
read from the alert topic or from signed webhook POSTs), and the fencing adapters that take faulty nodes out of
a scheduler (`fence`: the applied-action journal and the fleet breaker; `slurm`, `kubernetes`: the backends).
Each reads the worker's actions through `follow.TopicReader`, which hands out only actions signed with the
worker's secret (`schemas.signature`).
"""
