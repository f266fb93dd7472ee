"""What a flight-recorder entry's op names: the collective, and for a point-to-point op its other end.

A `flight` entry's `op` is a normalized name (``allreduce``) when gangwatch's producer wrote it, or PyTorch's
`profiling_name` as the recorder kept it (``nccl:_all_gather_base``, ``nccl:send 0->3``) when another producer
framed the dump; both read alike through `op_name`. A point-to-point op is one named ``send`` / ``recv``
(whatever marks it), and its peer, the other end's index in the op's process group, is in PyTorch's name.
"""

from __future__ import annotations

import re

_ID_MAX = 256  # the contract's limit on ids (pg, desc, op)
P2P_OPS = frozenset({"send", "recv"})
_P2P_META = re.compile(r"\b(send|recv)\s+(\d+|\?)\s*(->|<-)\s*(\d+|\?)\s*$")


def op_name(profiling_name: str) -> str:
    """Collective name without backend prefix or decoration: ``nccl:all_reduce`` -> ``allreduce``.

    ``gloo:broadcast`` -> ``broadcast``; ``nccl:_allgather_base`` -> ``allgather``;
    ``nccl:send 0->1`` -> ``send``; a name already normalized is kept.
    """
    name = profiling_name.split(":", 1)[-1].strip().split(" ", 1)[0].strip("_")
    if name.endswith("_base"):
        name = name[: -len("_base")]
    return name.replace("_", "")[:_ID_MAX] or "unknown"


def p2p_peer(profiling_name: str) -> int | None:
    """The other end of a point-to-point op, as its index in the op's process group, from its name.

    PyTorch names them ``nccl:send 1->2`` (this rank 1 sends to 2) and
    ``nccl:recv 3<-0`` (this rank 3 receives from 0); ``gloo:recv 3<-?`` (any
    source) names no peer: None, as for a name of another form.
    """
    m = _P2P_META.search(profiling_name)
    if m is None:
        return None
    op, a, arrow, b = m.groups()
    peer = b if (op == "send" and arrow == "->") or (op == "recv" and arrow == "<-") else None
    return int(peer) if peer is not None and peer.isdigit() else None
