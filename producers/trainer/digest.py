"""A short fingerprint of a model shard, for the silent-data-corruption vote.

Data-parallel replicas of one (tp, pp) shard hold bit-identical parameters
after every optimizer step. Each rank reports `replica_digest(model.parameters())`
on the same steps; a rank whose digest disagrees with the majority of its
replicas computed something wrong (detectors/sdc.py).

The digest is 16 hex digits of BLAKE2b over, per tensor in order: its dtype,
its shape, and its contents. Equal values give equal digests on every machine;
changing one bit of one weight changes it.

- numpy arrays and CPU tensors: the raw bytes are hashed.
- GPU tensors: copying them to the host would move the whole shard over PCIe,
  so each is folded on the GPU into a 64-bit checksum, sum(byte_i * (2i + 1))
  with wrap-around integer arithmetic (exact and order-independent, so every
  GPU computes the same number; a changed byte changes the sum, because its
  weight is odd), and only the checksums are copied back, once per call. That
  copy waits for the GPU: compute digests every N steps, not every step.

torch and numpy are imported only when such values are passed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

_CHUNK = 1 << 24  # bytes folded per kernel on the GPU (the int64 temporary is 8x this)


def replica_digest(values: Iterable[Any]) -> str:
    """Digest of tensors or arrays (e.g. `model.parameters()`), in the order given."""
    h = hashlib.blake2b(digest_size=8)
    device_sums = []
    for v in values:
        if hasattr(v, "detach"):  # a torch tensor (a Parameter too)
            v = v.detach()
            h.update(f"{v.dtype}{tuple(v.shape)}".encode())
            if v.device.type == "cpu":
                h.update(_tensor_bytes(v))
            else:
                device_sums.append(device_checksum(v))
        else:
            import numpy as np

            a = np.ascontiguousarray(v)
            h.update(f"{a.dtype.str}{a.shape}".encode())
            h.update(a.view(np.uint8).reshape(-1).data)
    if device_sums:
        import torch

        h.update(torch.stack(device_sums).cpu().numpy().tobytes())  # the one device-to-host copy
    return h.hexdigest()


def _tensor_bytes(t: Any) -> memoryview:
    """The raw bytes of a CPU tensor, any dtype (bfloat16 has no numpy type: go through uint8)."""
    import torch

    return t.contiguous().reshape(-1).view(torch.uint8).numpy().data


def device_checksum(t: Any) -> Any:
    """sum(byte_i * (2i + 1)) mod 2^64 over the bytes of `t`, on its device, as a 0-d int64 tensor."""
    import torch

    data = t.contiguous().reshape(-1).view(torch.uint8)
    total = torch.zeros((), dtype=torch.int64, device=t.device)
    for start in range(0, data.numel(), _CHUNK):
        chunk = data[start:start + _CHUNK].to(torch.int64)
        weights = torch.arange(start, start + chunk.numel(), dtype=torch.int64, device=t.device) * 2 + 1
        total += (chunk * weights).sum()
    return total


def grad_norm(params: Iterable[Any]) -> Any:
    """Total L2 norm of the gradients of `params`, as a 0-d tensor (not read back: no GPU sync here)."""
    import torch

    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return None
    return torch.nn.utils.get_total_norm(grads, foreach=True)

