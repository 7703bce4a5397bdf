"""Segments: a power-of-two share of every scale-up domain, the rest of the domain left idle.

A structured placement (:func:`nest.core.plan.place`) lays a plan's groups out on consecutive
device ids, so on a cluster whose scale-up domain (level 0) holds a number of devices that is not
a power of two, a power-of-two group straddles two domains: on GB200 NVL72 racks (72 GPUs on one
NVLink domain) an expert group of 32 or 64 GPUs starting at GPU 64 spans two racks and its
all-to-all runs at the 50 GB/s network rate instead of NVLink's 900 GB/s.

Practitioners allocate such jobs in *segments*: Slurm's topology/block plugin, whose blocks are
the NVLink domains (one per GB200 rack), places a job's nodes in segments of ``--segment`` nodes
that each lie inside one block (docs.coreweave.com/products/sunk/optimize_workloads/
topology-scheduling, "Blocks", "Segments"; slurm.schedmd.com/topology.html, topology/block), and
Megatron-MoE-ModelZoo's Qwen3-235B commands (yanring/Megatron-MoE-ModelZoo@020b813:
best_practice/qwen3/readme.md, "NVLink Domain Size: 72") run EP64 with ``SEGMENT=16`` and EP8 with
``SEGMENT=2`` on GB200, EP32 with ``SEGMENT=8`` on GB300, in nodes of 4 GPUs: at most 64 of a
rack's 72 GPUs per segment, so each expert group lives in one rack and the rack's other trays
stay out of the job (CoreWeave's GB200 page also advises workloads to
tolerate two of a rack's 18 nodes unavailable: docs.coreweave.com/docs/platform/instances/gb200).

:func:`segment_view` is that allocation as a cluster: the same levels with the scale-up domain's
fanout rounded down to a power of two (72 -> 64), the devices scaled (16 racks: 1152 -> 1024);
only level 0 is rounded, the domain a segment is allocated in.
Device ``v`` of the view is device :func:`real_ids` ``(v)`` of the cluster: the same domain, the
same position inside it, so every group of the view touches the same blocks of every level as
its image (the same level split, :mod:`nest.core.hierarchy`) and every pipeline boundary has the
same lowest common level: a plan of the view and its image on the cluster cost the same
(:func:`on_cluster`; the evaluator reads only device ids through the fabric). The top level is
never rounded: a structured plan may leave the devices past its last one idle already.
Clusters given as a graph (:mod:`nest.graph`) have no view (their network routes traffic by
device, not by block).
"""

from dataclasses import replace

import numpy as np

from nest.core.plan import Plan
from nest.core.topology import Cluster


def segment_size(fanout: int) -> int:
    """The largest power of two at most ``fanout`` (``fanout >= 1``)."""
    return 1 << (int(fanout).bit_length() - 1)


def segment_view(cluster: Cluster) -> Cluster | None:
    """The cluster with a power-of-two share of every scale-up domain (module docstring); None
    when there is nothing to round: the domain's fanout is a power of two already, it is the
    top level or the only domain, or the cluster is a graph (:meth:`Cluster.with_domain_fanout`
    says which)."""
    domain = cluster.levels[0]
    if cluster.num_levels < 2 or cluster.num_devices == domain.fanout:
        return None  # one domain: a view plan is already a plan on its first devices
    size = segment_size(domain.fanout)
    if size == domain.fanout:
        return None
    return cluster.with_domain_fanout(size)


def real_ids(view_ids, view: Cluster, cluster: Cluster) -> np.ndarray:
    """The cluster's ids of devices of its :func:`segment_view`: the same domain, the same
    position in it (the first ``size`` devices of each domain are used)."""
    ids = np.asarray(view_ids, dtype=np.int64)
    size, fanout = view.levels[0].fanout, cluster.levels[0].fanout
    return (ids // size) * fanout + ids % size


def on_cluster(plan: Plan, view: Cluster, cluster: Cluster) -> Plan:
    """A plan of the view with its devices renamed to the cluster's (:func:`real_ids`); the rest
    of the plan (degrees, rank order, partition, record) unchanged."""
    stages = tuple(
        replace(s, devices=_nested(real_ids(s.devices, view, cluster))) for s in plan.stages
    )
    return replace(plan, stages=stages)


def _nested(arr: np.ndarray) -> tuple:
    """A ``[dp][cp][tp]`` array as nested tuples of ints (a stage's ``devices``)."""
    return tuple(tuple(tuple(int(x) for x in row) for row in rep) for rep in arr.tolist())


def segment_allocation(search: dict | None) -> str | None:
    """What a plan's search record says to allocate when the segment view won (``search``:
    :attr:`nest.core.plan.Plan.search`, written by the ``nest`` planner): "the first N devices
    of every D domain"; None for a plan on the cluster as given."""
    search = search or {}
    if not search.get("segment_chosen"):
        return None
    return (
        f"the first {search['segment_devices_per_domain']} devices of every "
        f"{search['segment_domain']} domain"
    )
