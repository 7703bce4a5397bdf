"""Clusters as graphs: arbitrary networks (tori, rail-optimised and oversubscribed fabrics,
measured tables, your own file) priced by the shared cost model.

- :mod:`nest.graph.build`: the file format, validation, measured tables, the Cluster of a graph;
- :mod:`nest.graph.generators`: presets with cited link figures;
- :mod:`nest.graph.network`: routing, link sharing and the collectives' cost classes (the
  :class:`~nest.core.fabric.Fabric` the cost model asks);
- :mod:`nest.graph.derive`: the hierarchy structured placements use;
- :mod:`nest.graph.floors`: provable floors for the search's bounds;
- :mod:`nest.graph.placements`: the exact planners' placements on a graph.

:func:`build_graph_cluster` turns a ``cluster`` config section into a Cluster.
"""

import inspect
from pathlib import Path

from nest.core.errors import UserError
from nest.core.hardware import Device
from nest.graph.build import graph_cluster, measured_graph, read_graph_file
from nest.graph.generators import GENERATORS, hierarchy_graph

TOPOLOGIES = (*GENERATORS, "measured", "hierarchy", "graph")


def _params(fn, params: dict, topology: str) -> dict:
    allowed = [p for p in inspect.signature(fn).parameters if p != "devices"]
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise UserError(
            f"cluster.params: unknown {unknown} for topology {topology}; allowed: {allowed}"
        )
    return params


def build_graph_cluster(c: dict, device: Device, hierarchy=None):
    """The Cluster of a ``cluster`` section with ``graph_path`` or ``topology`` set;
    ``hierarchy`` is the section's hierarchical cluster (``topology: hierarchy`` only)."""
    name = c.get("name") or "graph"
    path, topology = c.get("graph_path"), c.get("topology")
    params = dict(c.get("params") or {})
    if topology == "graph":  # conf/cluster/graph.yaml: a file, which must be given
        topology = None
        if not path:
            read_graph_file(None)  # the error naming cluster.graph_path
    if path and topology:
        raise UserError(
            f"cluster {name}: give cluster.graph_path or cluster.topology, not both "
            f"(graph_path={path}, topology={topology})"
        )
    if path:
        if params:
            raise UserError(f"cluster.params={params} apply to topology generators, not files")
        if name == "graph":  # the preset's name: the file's says more
            name = Path(str(path)).stem
        return graph_cluster(name, device, read_graph_file(path))
    if topology not in TOPOLOGIES:
        raise UserError(f"cluster.topology={topology!r}; use one of {list(TOPOLOGIES)}")
    if topology == "measured":
        allowed = {"table", "latency_us"}
        if set(params) - allowed:
            raise UserError(
                f"cluster.params: unknown {sorted(set(params) - allowed)} for topology measured;"
                f" allowed: {sorted(allowed)}"
            )
        graph = measured_graph(params.get("table"), latency_us=params.get("latency_us", 5.0))
        devices = c.get("devices")
        if devices is not None and devices != graph.number_of_nodes():
            raise UserError(
                f"cluster.devices={devices} but the table measures {graph.number_of_nodes()} "
                "devices; drop cluster.devices or make them agree"
            )
        return graph_cluster(name, device, graph)
    if topology == "hierarchy":
        if params:
            raise UserError("cluster.params: topology hierarchy takes none (it uses the levels)")
        return graph_cluster(name, device, hierarchy_graph(hierarchy))
    devices = c.get("devices")
    if devices is None:
        raise UserError(f"cluster.topology={topology} needs cluster.devices")
    fn = GENERATORS[topology]
    return graph_cluster(name, device, fn(devices, **_params(fn, params, topology)))


def refuse_in_network(c: dict) -> None:
    """A graph cluster routes ring collectives only: ``cluster.nvls`` / ``cluster.sharp`` on
    is a one-line error (in-network reductions are modelled on a hierarchy of levels)."""
    on = [option for option in ("nvls", "sharp") if c.get(option)]
    if on:
        where = c.get("graph_path") or f"topology={c.get('topology')}"
        fixes = " ".join(f"cluster.{option}=false" for option in on)
        raise UserError(
            f"cluster.{on[0]}=true on a graph cluster ({where}): in-network reductions are "
            f"modelled on a hierarchy of levels only; add {fixes}"
        )


__all__ = ["TOPOLOGIES", "build_graph_cluster", "refuse_in_network"]
