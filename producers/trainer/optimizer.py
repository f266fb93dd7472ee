"""A torch optimizer, one line: `client.watch_optimizer(optimizer)`.

A step post-hook (`Optimizer.register_step_post_hook`) reports a step after
every `optimizer.step()`, numbered from `first_step` up, with `step_s` (time
between optimizer steps) and the norm of the gradients the optimizer just used
(after any clipping; a tensor, read on the sending thread). With
`digest_every=N` the parameters' `replica_digest` is added every N steps (it
reads the parameters back from the GPU: keep N large on big models).

Loss and section times are not visible from an optimizer hook: time sections
with `client.section(...)` in the loop (they are reported with the next
optimizer step), or call `client.step(...)` yourself instead of this hook.

Returns the hook's handle: `handle.remove()` stops reporting.
"""

from __future__ import annotations

from typing import Any

from gangwatch.producers.trainer.digest import grad_norm, replica_digest
from gangwatch.producers.trainer.loop import StepReporter


def watch_optimizer(client: StepReporter, optimizer: Any, *, first_step: int = 0, digest_every: int = 0,
                    grad_norms: bool = True) -> Any:
    """Register the post-hook on `optimizer`; returns its removable handle."""
    step = first_step - 1

    def params() -> list:
        return [p for group in optimizer.param_groups for p in group["params"]]

    def hook(opt: Any, args: Any, kwargs: Any) -> None:
        nonlocal step
        step += 1
        digest = replica_digest(params()) if digest_every and step % digest_every == 0 else None
        client.step(step, grad_norm=grad_norm(params()) if grad_norms else None, replica_digest=digest)

    return optimizer.register_step_post_hook(hook)
