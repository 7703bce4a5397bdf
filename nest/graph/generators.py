"""Graphs of real cluster shapes, with their link figures' sources; each returns a networkx graph
in the file format of :mod:`nest.graph.build` (so it can be saved and edited).

- :func:`tpuv4_torus`: a TPU v4 slice, a 3-D torus of 4x4x4 cubes (any multiple of 64 chips)
  with wrap-around links (the optical circuit switches close each dimension's ring; Jouppi et
  al., "TPU v4: An Optically Reconfigurable Supercomputer for Machine Learning with Hardware
  Support for Embeddings", ISCA 2023; slice shapes AxBxC with every dimension a multiple of 4,
  cloud.google.com/tpu/docs/v4). Link: 46.875 GB/s per direction, from the pod's 24 TB/s
  bisection bandwidth (cloud.google.com/tpu/docs/v4) over the 512 links a 16x16x16 torus's
  bisection cuts (256 rings, two crossings each). Dimension-order routing. Latency per hop
  assumed (1 us).
- :func:`rail_optimized`: an NVIDIA DGX H100 SuperPOD (reference architecture RA-11333-001):
  nodes of 8 H100 on NVLink 4 / NVSwitch (900 GB/s per GPU in total = 450 per direction, H100
  datasheet), one 400 Gb/s ConnectX-7 NIC per GPU (50 GB/s per direction) to the leaf switch of
  its rail (GPU ``i`` of every node of a 32-node scalable unit on leaf ``i``), leaves joined by
  spine switches without oversubscription. Latencies assumed (1 us per NVLink hop, 2.5 us per
  NIC link, 1 us per leaf-spine link: 2, 5 and 7 us device to device). Links at line rate: the
  hierarchical ``dgx_h100_superpod`` prices collectives at NCCL's achieved bandwidth (its
  ``bw_efficiency``), which a graph applies only through the link figures it is given.
- :func:`leaf_spine`: nodes of 8 GPUs on NVLink, each GPU's NIC on its node's leaf (top-of-rack)
  switch, leaves joined by spines with an oversubscription ratio: Meta's Llama 3 RoCE fabric runs
  7:1 at its aggregation layer (Dubey et al., "The Llama 3 Herd of Models", 2024, §3.3.1), the
  default here; the same NIC and NVLink figures and assumed latencies as above.
- :func:`hierarchy_graph`: any hierarchical cluster as a graph (a switch per block and level,
  every device on its own link to each), on which the graph model equals the hierarchical one.
"""

import itertools
from math import prod

import networkx as nx

from nest.core.errors import UserError
from nest.core.topology import Cluster
from nest.core.units import GB, US
from nest.graph.build import checked_number
from nest.graph.network import REFERENCE_BYTES, TIE

TPU_V4_LINK_GBPS = 24_000 / 512
"""46.875 GB/s per ICI link per direction (module docstring: the pod's bisection / its links)."""


def _positive_int(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"{what}={value!r} must be a positive integer")
    return value


def _link_figures(**figures) -> list[float]:
    """Each ``*_bw_gbps`` a number > 0, each ``*_latency_us`` a number >= 0, as floats in the
    order given (one-line errors naming the parameter)."""
    return [
        checked_number(
            value, f"cluster.params.{name}", minimum=0.0, strict=name.endswith("_bw_gbps")
        )
        for name, value in figures.items()
    ]


def _torus_dims(devices: int) -> tuple[int, int, int]:
    """The most cube-like shape of ``devices / 64`` cubes, ascending (128 -> 4x4x8, 1024 ->
    8x8x16, 4096 -> 16x16x16)."""
    cubes = devices // 64
    best = None
    for a in range(1, cubes + 1):
        for b in range(a, cubes + 1):
            if cubes % (a * b):
                continue
            c = cubes // (a * b)
            if c < b:
                continue
            key = (c / a, c, b)
            if best is None or key < best[0]:
                best = (key, (4 * a, 4 * b, 4 * c))
    return best[1]


def tpuv4_torus(
    devices: int,
    *,
    shape: list | None = None,
    link_bw_gbps: float = TPU_V4_LINK_GBPS,
    link_latency_us: float = 1.0,
) -> nx.Graph:
    """A TPU v4 slice of ``devices`` chips (module docstring); ``shape=[X, Y, Z]`` overrides the
    most cube-like one. Chips are numbered x fastest, then y, then z."""
    _positive_int(devices, "cluster.devices")
    link_bw_gbps, link_latency_us = _link_figures(
        link_bw_gbps=link_bw_gbps, link_latency_us=link_latency_us
    )
    if shape is None:
        if devices % 64:
            raise UserError(
                f"cluster.devices={devices}: a TPU v4 slice is made of 4x4x4 cubes; use a "
                "multiple of 64 (or give cluster.params.shape=[X, Y, Z])"
            )
        dims = _torus_dims(devices)
    else:
        if not isinstance(shape, list | tuple):
            raise UserError(f"cluster.params.shape={shape!r} must be a list [X, Y, Z]")
        dims = tuple(_positive_int(d, "cluster.params.shape entry") for d in shape)
        if len(dims) != 3 or prod(dims) != devices:
            raise UserError(
                f"cluster.params.shape={list(shape)} must be three sizes multiplying to "
                f"cluster.devices={devices}"
            )
    x_n, y_n, z_n = dims
    graph = nx.Graph(
        name=f"tpuv4_torus_{x_n}x{y_n}x{z_n}",
        routing="dimension_order",
        dims=list(dims),
        symmetric=True,
        level_names=["x", "y", "z"],
    )

    def key(x, y, z):
        return f"chip{x}.{y}.{z}"

    for z, y, x in itertools.product(range(z_n), range(y_n), range(x_n)):
        pos = [x + (x_n + 1) * (z % 8), y + (y_n + 1) * (z // 8)]  # z planes side by side
        graph.add_node(key(x, y, z), kind="gpu", coord=[x, y, z], pos=pos)
    for z, y, x in itertools.product(range(z_n), range(y_n), range(x_n)):
        for d, size in enumerate(dims):
            if size == 1 or (size == 2 and (x, y, z)[d] == 1):
                continue  # a ring of two is one link
            nb = [x, y, z]
            nb[d] = (nb[d] + 1) % size
            graph.add_edge(key(x, y, z), key(*nb), bw_gbps=link_bw_gbps, latency_us=link_latency_us)
    return graph


def _nodes_and_nvlink(graph, n_nodes, gpus, nvlink_bw_gbps, nvlink_latency_us, node_x):
    for node in range(n_nodes):
        nvs = f"nvswitch{node}"
        graph.add_node(nvs, kind="switch", pos=[node_x(node), -1.5])
        for i in range(gpus):
            gpu = f"gpu{node}.{i}"
            graph.add_node(gpu, kind="gpu", pos=[node_x(node), i])
            graph.add_edge(gpu, nvs, bw_gbps=nvlink_bw_gbps, latency_us=nvlink_latency_us)


def rail_optimized(
    devices: int,
    *,
    gpus_per_node: int = 8,
    nodes_per_su: int = 32,
    spines: int = 4,
    nvlink_bw_gbps: float = 450.0,
    nvlink_latency_us: float = 1.0,
    nic_bw_gbps: float = 50.0,
    nic_latency_us: float = 2.5,
    spine_latency_us: float = 1.0,
) -> nx.Graph:
    """A rail-optimised DGX H100 SuperPOD of ``devices`` GPUs (module docstring): scalable units
    of ``nodes_per_su`` nodes (fewer when the cluster is smaller than one), GPU ``i`` of every
    node of a unit on that unit's rail-``i`` leaf, every leaf linked to every spine with the
    unit's rail bandwidth split evenly (non-blocking)."""
    for name, value in (
        ("gpus_per_node", gpus_per_node),
        ("nodes_per_su", nodes_per_su),
        ("spines", spines),
    ):
        _positive_int(value, f"cluster.params.{name}")
    _positive_int(devices, "cluster.devices")
    nvlink_bw_gbps, nvlink_latency_us, nic_bw_gbps, nic_latency_us, spine_latency_us = (
        _link_figures(
            nvlink_bw_gbps=nvlink_bw_gbps,
            nvlink_latency_us=nvlink_latency_us,
            nic_bw_gbps=nic_bw_gbps,
            nic_latency_us=nic_latency_us,
            spine_latency_us=spine_latency_us,
        )
    )
    if devices % gpus_per_node:
        raise UserError(
            f"cluster.devices={devices} is not a multiple of gpus_per_node={gpus_per_node}"
        )
    n_nodes = devices // gpus_per_node
    per_su = min(nodes_per_su, n_nodes)
    if n_nodes % per_su:
        raise UserError(
            f"cluster.devices={devices}: {n_nodes} nodes do not fill scalable units of "
            f"{nodes_per_su}; use a multiple of {nodes_per_su * gpus_per_node} GPUs"
        )
    n_su = n_nodes // per_su
    graph = nx.Graph(
        name=f"rail_optimized_{devices}",
        symmetric=True,
        level_names=["nvlink", "rail", "spine"] if n_su > 1 else ["nvlink", "rail"],
    )
    _nodes_and_nvlink(
        graph,
        n_nodes,
        gpus_per_node,
        nvlink_bw_gbps,
        nvlink_latency_us,
        lambda node: node + 2 * (node // per_su),
    )
    uplink = per_su * nic_bw_gbps / spines
    for k in range(spines):
        graph.add_node(
            f"spine{k}",
            kind="switch",
            pos=[n_nodes + 2 * n_su + 3, gpus_per_node * (k + 0.5) / spines],
        )
    for su in range(n_su):
        for i in range(gpus_per_node):
            leaf = f"leaf{su}.{i}"
            graph.add_node(leaf, kind="switch", pos=[n_nodes + 2 * n_su + 1, i + su / (n_su + 1)])
            for node in range(su * per_su, (su + 1) * per_su):
                graph.add_edge(
                    f"gpu{node}.{i}", leaf, bw_gbps=nic_bw_gbps, latency_us=nic_latency_us
                )
            for k in range(spines):
                graph.add_edge(leaf, f"spine{k}", bw_gbps=uplink, latency_us=spine_latency_us)
    return graph


def leaf_spine(
    devices: int,
    *,
    gpus_per_node: int = 8,
    nodes_per_leaf: int = 4,
    spines: int = 4,
    oversubscription: float = 7.0,
    nvlink_bw_gbps: float = 450.0,
    nvlink_latency_us: float = 1.0,
    nic_bw_gbps: float = 50.0,
    nic_latency_us: float = 2.5,
    spine_latency_us: float = 1.0,
) -> nx.Graph:
    """An oversubscribed leaf-spine fabric of ``devices`` GPUs (module docstring): every GPU's
    NIC on its node's leaf, each leaf linked to every spine with its hosts' NIC bandwidth divided
    by ``oversubscription`` in all, split evenly over the spines."""
    for name, value in (
        ("gpus_per_node", gpus_per_node),
        ("nodes_per_leaf", nodes_per_leaf),
        ("spines", spines),
    ):
        _positive_int(value, f"cluster.params.{name}")
    _positive_int(devices, "cluster.devices")
    nvlink_bw_gbps, nvlink_latency_us, nic_bw_gbps, nic_latency_us, spine_latency_us = (
        _link_figures(
            nvlink_bw_gbps=nvlink_bw_gbps,
            nvlink_latency_us=nvlink_latency_us,
            nic_bw_gbps=nic_bw_gbps,
            nic_latency_us=nic_latency_us,
            spine_latency_us=spine_latency_us,
        )
    )
    oversubscription = checked_number(
        oversubscription, "cluster.params.oversubscription", minimum=1.0, strict=False
    )
    per_leaf = gpus_per_node * nodes_per_leaf
    if devices % per_leaf:
        raise UserError(
            f"cluster.devices={devices} is not a multiple of a leaf's {per_leaf} GPUs "
            f"(gpus_per_node={gpus_per_node} x nodes_per_leaf={nodes_per_leaf})"
        )
    n_nodes, n_leaves = devices // gpus_per_node, devices // per_leaf
    graph = nx.Graph(
        name=f"leaf_spine_{devices}_{oversubscription:g}to1",
        symmetric=True,
        level_names=["nvlink", "leaf", "spine"],
    )
    _nodes_and_nvlink(
        graph,
        n_nodes,
        gpus_per_node,
        nvlink_bw_gbps,
        nvlink_latency_us,
        lambda node: node + node // nodes_per_leaf,
    )
    uplink = per_leaf * nic_bw_gbps / oversubscription / spines
    for k in range(spines):
        graph.add_node(
            f"spine{k}",
            kind="switch",
            pos=[(n_nodes + n_leaves) * (k + 0.5) / spines, gpus_per_node + 4],
        )
    for leaf in range(n_leaves):
        name = f"leaf{leaf}"
        first = leaf * nodes_per_leaf
        graph.add_node(
            name, kind="switch", pos=[first + leaf + (nodes_per_leaf - 1) / 2, gpus_per_node + 1.5]
        )
        for node in range(first, first + nodes_per_leaf):
            for i in range(gpus_per_node):
                graph.add_edge(
                    f"gpu{node}.{i}", name, bw_gbps=nic_bw_gbps, latency_us=nic_latency_us
                )
        for k in range(spines):
            graph.add_edge(name, f"spine{k}", bw_gbps=uplink, latency_us=spine_latency_us)
    return graph


def hierarchy_graph(cluster: Cluster) -> nx.Graph:
    """A hierarchical cluster as a graph: per level and block a switch, every device on its own
    link to the switch of each of its blocks at that level's bottleneck bandwidth
    (:meth:`~nest.core.topology.Cluster.path_bw_bytes_per_s`: the achieved rate, ``bw_efficiency``
    and oversubscription applied, which is what the hierarchy's collectives move) and half its
    latency (a ring step crosses two links; :mod:`nest.cost.collectives` charges one latency per
    step, so a change there needs the matching one here). Routing then
    sends a pair's traffic through the switch of its lowest common level (checked: that path
    must be strictly the cheapest), so no two flows of a ring level share a link and the graph
    model prices every plan as the hierarchy does."""
    n = cluster.num_devices
    levels = cluster.levels
    costs = [
        lv.latency_s + 2 * REFERENCE_BYTES / cluster.path_bw_bytes_per_s(i)
        for i, lv in enumerate(levels)
    ]
    for i in range(len(costs) - 1):
        if not costs[i + 1] > costs[i] * (1 + 10 * TIE):
            raise UserError(
                f"cluster {cluster.name}: levels {levels[i].name} and {levels[i + 1].name} cost "
                "the same to cross, so routing would split traffic over both; the hierarchy "
                "graph needs a higher latency or lower bandwidth going outwards"
            )
    graph = nx.Graph(
        name=f"{cluster.name}_graph", symmetric=True, level_names=[lv.name for lv in levels]
    )
    for d in range(n):
        graph.add_node(f"d{d}", kind="gpu", pos=[d, 0])
    for i, lv in enumerate(levels):
        size = cluster.block_size(i)
        for block in range(n // size):
            switch = f"{lv.name}:{block}"
            graph.add_node(switch, kind="switch", pos=[block * size + (size - 1) / 2, i + 1])
            for d in range(block * size, (block + 1) * size):
                graph.add_edge(
                    f"d{d}",
                    switch,
                    bw_gbps=cluster.path_bw_bytes_per_s(i) / GB,
                    latency_us=lv.latency_s / 2 / US,
                )
    return graph


GENERATORS = {
    "tpuv4_torus": tpuv4_torus,
    "rail_optimized": rail_optimized,
    "leaf_spine": leaf_spine,
}
