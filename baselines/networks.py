"""Simplified views of a cluster's network that the baselines search on.

The network-agnostic baselines (``phaze``, ``mcmc``) search on a *flat* network: one level, every
pair of devices at the same bandwidth and latency. ``alpa`` searches on *two* levels: inside a
node and across nodes. Every view keeps the device, the device count and the device ids, so a plan
found on the view is a valid plan on the real cluster, where it is then scored
(:func:`nest.planner.finish`). Only the search sees the simplification.
"""

from dataclasses import replace

from nest.core.errors import UserError
from nest.core.problem import Problem
from nest.core.topology import Cluster, Level
from nest.core.units import GB, US


def slowest_pair(cluster: Cluster) -> tuple[float, float]:
    """(bandwidth bytes/s, latency s) between two devices in different top-level blocks.

    Traffic through the top level runs at the bottleneck of every level below it
    (:meth:`Cluster.path_bw_bytes_per_s`), so this is the slowest pair of the cluster.
    """
    top = cluster.num_levels - 1
    return cluster.path_bw_bytes_per_s(top), cluster.levels[top].latency_s


def flat_cluster(
    cluster: Cluster, *, bw_gbps: float | None = None, latency_us: float | None = None
) -> Cluster:
    """One level holding every device, at the given bandwidth and latency (default: the slowest
    pair's, :func:`slowest_pair`). ``bw_gbps`` is decimal GB/s per device per direction."""
    bw, lat = slowest_pair(cluster)
    if bw_gbps is not None:
        if not isinstance(bw_gbps, int | float) or bw_gbps <= 0:
            raise UserError(f"solver.flat_bw_gbps={bw_gbps!r} must be > 0 (or null)")
        bw = bw_gbps * GB
    if latency_us is not None:
        if not isinstance(latency_us, int | float) or latency_us < 0:
            raise UserError(f"solver.flat_latency_us={latency_us!r} must be >= 0 (or null)")
        lat = latency_us * US
    level = Level(name="flat", fanout=cluster.num_devices, bw_bytes_per_s=bw, latency_s=lat)
    return Cluster(name=f"{cluster.name} (flat)", device=cluster.device, levels=(level,))


def two_level_cluster(cluster: Cluster) -> Cluster:
    """Inside a node (the real level 0) and across nodes (one level at the slowest pair's
    bandwidth and latency): the two-level view Alpa's device mesh assumes."""
    node = cluster.levels[0]
    inside = Level(
        name=node.name,
        fanout=node.fanout,
        bw_bytes_per_s=node.effective_bw_bytes_per_s,
        latency_s=node.latency_s,
    )
    if cluster.num_levels == 1:
        return Cluster(name=f"{cluster.name} (2-level)", device=cluster.device, levels=(inside,))
    bw, lat = slowest_pair(cluster)
    across = Level(
        name="across",
        fanout=cluster.num_devices // node.fanout,
        bw_bytes_per_s=bw,
        latency_s=lat,
    )
    return Cluster(name=f"{cluster.name} (2-level)", device=cluster.device, levels=(inside, across))


def with_cluster(problem: Problem, cluster: Cluster) -> Problem:
    """The same model and training on another view of the same devices."""
    if cluster.num_devices != problem.cluster.num_devices:
        raise AssertionError("a network view keeps the device count")
    return replace(problem, cluster=cluster)
