"""The links between GPUs as data: per-GPU bandwidth inside a node and across nodes, and the
latency the α–β model charges per step of a ring.

Bandwidths are the vendors' published figures, one direction per GPU (a ring sends and receives
at once): NVLink 4 on H100/H200 SXM is 900 GB/s bidirectional per GPU, NVLink 3 on A100 SXM
600 GB/s; across nodes a DGX H100/H200 has one 400 Gb/s ConnectX-7 (InfiniBand NDR) per GPU, a
DGX A100 one 200 Gb/s ConnectX-6 (HDR) per GPU. The latencies are assumptions, not vendor
figures (a ring step costs a few µs in NCCL inside a node, more across one), printed as such.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Links:
    """One direction of a GPU's links: inside its node and to other nodes."""

    name: str
    intra_bytes_s: float        # NVLink, per GPU, one direction
    inter_bytes_s: float        # network, per GPU, one direction
    intra_latency_s: float      # per ring step (assumed)
    inter_latency_s: float      # per ring step (assumed)
    source: str

    def as_dict(self) -> dict:
        """The figures as plain data (the plan's ``--json``)."""
        return asdict(self)


LINKS = {
    "h100": Links("h100", 450e9, 50e9, 5e-6, 10e-6,
                  "H100 SXM5: NVLink 4 900 GB/s bidirectional; DGX H100: 8x 400 Gb/s ConnectX-7"),
    "h200": Links("h200", 450e9, 50e9, 5e-6, 10e-6,
                  "H200 SXM: NVLink 4 900 GB/s bidirectional; DGX H200: 8x 400 Gb/s ConnectX-7"),
    "a100": Links("a100", 300e9, 25e9, 5e-6, 10e-6,
                  "A100 SXM: NVLink 3 600 GB/s bidirectional; DGX A100: 8x 200 Gb/s ConnectX-6"),
}

# ring steps per collective over n devices: an all-reduce is a reduce-scatter then an all-gather
RING_STEPS = {"all-reduce": 2, "all-gather": 1, "reduce-scatter": 1, "all-to-all": 1,
              "collective-permute": 0}


def crosses_nodes(mesh: dict, axis: str, gpus_per_node: int) -> bool:
    """Whether ``axis``'s groups span nodes: devices are numbered with the last mesh axis
    fastest, a node holds ``gpus_per_node`` consecutive ones, so a group of ``axis`` spans
    ``size × stride`` consecutive devices (``stride``: the product of the axes after it)."""
    names = list(mesh)
    stride = 1
    for a in names[names.index(axis) + 1:]:
        stride *= int(mesh[a])
    return int(mesh[axis]) * stride > gpus_per_node


def collective_seconds(kind: str, ring_bytes: float, count: int, n: int, *, inter: bool,
                       links: Links) -> float:
    """α–β time of ``count`` collectives of ``kind`` over ``n`` devices that send ``ring_bytes``
    per device in all (the ring's bytes, as ``parallel.comm.ring_bytes`` counts them)."""
    beta = links.inter_bytes_s if inter else links.intra_bytes_s
    alpha = links.inter_latency_s if inter else links.intra_latency_s
    steps = max(RING_STEPS.get(kind, 1) * (n - 1), 1)
    return ring_bytes / beta + count * steps * alpha


def size(n: float) -> str:
    """Bytes in decimal units, as GPU memory is sold (80 GB = 80e9 bytes), 3 digits."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} B"
