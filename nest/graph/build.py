"""Graph clusters from files, generators and measured tables: validation and the Cluster they make.

**File format** (``cluster=graph cluster.graph_path=FILE``): a networkx node-link JSON document
(what ``json.dump(networkx.node_link_data(G))`` writes; ``"edges"`` or the older ``"links"``) or
a GraphML file (``networkx.write_graphml``), undirected, one edge per link:

- nodes: ``kind: gpu`` (a device; devices take ids ``0..N-1`` in the order the file lists them,
  all of ``cluster.device``'s kind) or ``kind: switch``; optional ``pos: [x, y]`` for drawing and,
  under dimension-order routing, ``coord: [x, y, z]``;
- edges: ``bw_gbps`` (decimal GB/s per direction, > 0) and ``latency_us`` (>= 0);
- any other node or edge attribute is refused (the cost model would ignore it), a node's
  ``device`` above all: every gpu node is ``cluster.device`` until heterogeneous clusters are
  supported;
- graph attributes, all optional: ``routing`` (``ecmp``, the default, or ``dimension_order``
  with ``dims: [X, Y, Z]`` and a ``coord`` per device), ``relay`` (``false``: devices do not
  forward other devices' traffic, only switches do), ``symmetric`` (see
  :attr:`nest.graph.network.Network.symmetric`; only when true), ``level_names`` (names of the
  derived levels). GraphML has no lists: write them as comma-separated strings
  (``"x,y,z"``).

Every device must reach every other. A bad file is one ``UserError`` naming the node or edge.

**Measured tables** (``cluster=measured cluster.params.table=FILE.csv``): a CSV with header
``device_a,device_b,gbps`` (optionally ``latency_us``), one row per device pair, the bandwidth
one device achieves sending to the other (e.g. nccl-tests' ``sendrecv_perf`` between the two).
Every pair must be measured; a pair given twice (both directions) keeps the lower figure. The
cluster is a complete graph of direct links at the measured rates that devices do not relay
(each pair's traffic takes its own measured path), so contention between pairs is not modelled
beyond what each measurement already holds.
"""

import csv
import json
from math import isfinite
from pathlib import Path
from xml.etree import ElementTree

import networkx as nx
import numpy as np

from nest.core.errors import UserError
from nest.core.hardware import Device
from nest.core.topology import Cluster
from nest.core.units import GB, US
from nest.graph.derive import derive_levels
from nest.graph.network import ROUTINGS, Network


def read_graph_file(path) -> nx.Graph:
    """A node-link JSON or GraphML file as an undirected networkx graph (module docstring)."""
    if path is None or str(path).strip() in ("", "???"):
        raise UserError("cluster=graph needs cluster.graph_path=FILE (node-link .json or .graphml)")
    file = Path(str(path)).expanduser()
    if not file.is_file():
        raise UserError(f"cluster.graph_path={path}: no such file")
    suffix = file.suffix.lower()
    try:
        if suffix == ".json":
            data = json.loads(file.read_text(encoding="utf-8-sig"))
            if not isinstance(data, dict) or "nodes" not in data:
                raise UserError(
                    f"cluster.graph_path={path}: not a node-link document (no 'nodes'); write "
                    "it with json.dump(networkx.node_link_data(G))"
                )
            if data.get("directed") or data.get("multigraph"):
                raise UserError(
                    f"cluster.graph_path={path}: the graph must be undirected and simple "
                    "(directed/multigraph set); give one edge per link"
                )
            edges = "links" if "links" in data and "edges" not in data else "edges"
            data.setdefault(edges, [])
            _refuse_duplicates(data, edges, f"cluster.graph_path={path}")
            return nx.node_link_graph(data, edges=edges)
        if suffix in (".graphml", ".xml"):
            _refuse_duplicate_graphml_nodes(file, f"cluster.graph_path={path}")
            graph = nx.read_graphml(file)
            if graph.is_directed() or graph.is_multigraph():
                raise UserError(
                    f"cluster.graph_path={path}: the graph must be undirected and simple (an "
                    "edge listed twice makes it a multigraph); give one edge per link"
                )
            return graph
    except UserError:
        raise
    except (ValueError, KeyError, TypeError, SyntaxError, nx.NetworkXError) as exc:
        # SyntaxError: a malformed GraphML's xml.etree ParseError; UnicodeDecodeError is a
        # ValueError
        raise UserError(f"cluster.graph_path={path}: cannot read it ({exc})") from None
    raise UserError(
        f"cluster.graph_path={path}: unknown format {suffix!r}; use a node-link .json or .graphml"
    )


def _refuse_duplicates(data: dict, edges: str, where: str) -> None:
    """A node listed twice, or a link listed twice (in either direction), is one error: networkx
    would keep the last one silently, and a second bandwidth would change the derived levels."""
    seen: set = set()
    for node in data.get("nodes") or []:
        key = node.get("id") if isinstance(node, dict) else None
        if key in seen:
            raise UserError(f"{where}: node {key!r} is listed twice; list each node once")
        seen.add(key)
    links: dict = {}
    for link in data.get(edges) or []:
        if not isinstance(link, dict) or "source" not in link or "target" not in link:
            continue  # networkx names what is missing
        a, b = link["source"], link["target"]
        key = frozenset((a, b)) if _hashable(a) and _hashable(b) else None
        if key is not None and key in links:
            raise UserError(
                f"{where}: edge {a!r} - {b!r} is listed twice (as {links[key]}); the graph is "
                "undirected, one edge per link carries both directions: list it once"
            )
        links[key] = f"{a!r} - {b!r}"


def _refuse_duplicate_graphml_nodes(file: Path, where: str) -> None:
    """A GraphML node listed twice is one error (networkx merges the two silently; an edge listed
    twice already makes a multigraph, refused by the caller)."""
    seen: set = set()
    for _, element in ElementTree.iterparse(file):
        if element.tag.rsplit("}", 1)[-1] == "node":
            key = element.get("id")
            if key in seen:
                raise UserError(f"{where}: node {key!r} is listed twice; list each node once")
            seen.add(key)


def _hashable(x) -> bool:
    try:
        hash(x)
    except TypeError:
        return False
    return True


def checked_number(value, what: str, *, minimum: float, strict: bool) -> float:
    """``value`` as a finite float above (``strict``) or at least ``minimum``, else a one-line
    error naming ``what``."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise UserError(f"{what}={value!r} must be a number") from None
    if not isfinite(x) or (x <= minimum if strict else x < minimum):
        raise UserError(f"{what}={value!r} must be {'>' if strict else '>='} {minimum:g}")
    return x


def _sequence(value, what: str) -> list:
    if isinstance(value, str):
        value = [v for v in value.replace(" ", "").split(",") if v]
    if not isinstance(value, list | tuple):
        raise UserError(f"{what}={value!r} must be a list")
    return list(value)


NODE_ATTRIBUTES = ("kind", "pos", "coord")
EDGE_ATTRIBUTES = ("bw_gbps", "latency_us")


def _check_attributes(graph: nx.Graph, where: str) -> None:
    """Refuse node and edge attributes the cost model would ignore (module docstring): a
    per-node ``device`` above all, since every gpu node is ``cluster.device`` until
    heterogeneous clusters are supported."""
    for node, data in graph.nodes(data=True):
        unknown = sorted(set(data) - set(NODE_ATTRIBUTES))
        if "device" in unknown:
            raise UserError(
                f"{where}: node {node!r} has device={data['device']!r}; per-node devices are not "
                "supported (every gpu node is cluster.device until heterogeneous clusters are): "
                "remove it and set cluster.device"
            )
        if unknown:
            raise UserError(
                f"{where}: node {node!r} has attributes {unknown} that the cost model would "
                f"ignore; a node takes only {list(NODE_ATTRIBUTES)}"
            )
    for a, b, data in graph.edges(data=True):
        unknown = sorted(set(data) - set(EDGE_ATTRIBUTES))
        if unknown:
            raise UserError(
                f"{where}: edge {a!r} - {b!r} has attributes {unknown} that the cost model would "
                f"ignore; an edge takes only {list(EDGE_ATTRIBUTES)}"
            )


def network_from_graph(graph: nx.Graph, name: str) -> Network:
    """Validate a graph (module docstring) and build its :class:`Network`."""
    where = f"graph {name}"
    if graph.is_directed() or graph.is_multigraph():
        raise UserError(f"{where}: the graph must be undirected and simple; one edge per link")
    _check_attributes(graph, where)
    devices, switches = [], []
    for node, data in graph.nodes(data=True):
        kind = data.get("kind")
        if kind == "gpu":
            devices.append(node)
        elif kind == "switch":
            switches.append(node)
        else:
            raise UserError(f"{where}: node {node!r} has kind={kind!r}; use kind: gpu or switch")
    if not devices:
        raise UserError(f"{where}: no node has kind: gpu; list the devices as gpu nodes")
    index = {node: i for i, node in enumerate(devices + switches)}
    src, dst, bw, lat = [], [], [], []
    for a, b, data in graph.edges(data=True):
        if a == b:
            raise UserError(f"{where}: edge {a!r} - {b!r} is a self-loop; remove it")
        edge = f"{where}: edge {a!r} - {b!r}"
        for key in ("bw_gbps", "latency_us"):
            if key not in data:
                unit = "decimal GB/s per direction" if key == "bw_gbps" else "microseconds"
                raise UserError(f"{edge} has no {key} ({unit})")
        b_gbps = checked_number(data["bw_gbps"], f"{edge} bw_gbps", minimum=0.0, strict=True)
        l_us = checked_number(data["latency_us"], f"{edge} latency_us", minimum=0.0, strict=False)
        for s, t in ((a, b), (b, a)):
            src.append(index[s])
            dst.append(index[t])
            bw.append(b_gbps * GB)
            lat.append(l_us * US)
    attrs = graph.graph
    routing = str(attrs.get("routing", "ecmp"))
    if routing not in ROUTINGS:
        raise UserError(f"{where}: routing={routing!r}; use one of {list(ROUTINGS)}")
    symmetric, relay = attrs.get("symmetric", False), attrs.get("relay", True)
    if isinstance(symmetric, str):
        symmetric = symmetric.strip().lower() == "true"
    if isinstance(relay, str):
        relay = relay.strip().lower() != "false"
    names = tuple(str(v) for v in _sequence(attrs.get("level_names", []), f"{where} level_names"))
    positions = {}
    for node, data in graph.nodes(data=True):
        if "pos" in data:
            pos = _sequence(data["pos"], f"{where}: node {node!r} pos")
            if len(pos) != 2:
                raise UserError(f"{where}: node {node!r} pos={data['pos']!r} must be [x, y]")
            positions[node] = tuple(
                checked_number(p, f"{where}: node {node!r} pos", minimum=-np.inf, strict=True)
                for p in pos
            )
    dims, coords = (), None
    if routing == "dimension_order":
        dims, coords = _torus_coords(graph, devices, switches, where)
    net = Network(
        name=name,
        devices=tuple(devices),
        switches=tuple(switches),
        link_src=np.array(src, dtype=np.int64),
        link_dst=np.array(dst, dtype=np.int64),
        link_bw=np.array(bw),
        link_lat=np.array(lat),
        routing=routing,
        relay=bool(relay),
        symmetric=bool(symmetric),
        dims=dims,
        coords=coords,
        level_names=names,
        positions=positions,
    )
    _check_connected(graph, devices, where)
    if not net.relay:
        _check_reach_without_relay(net, where)
    if routing == "dimension_order":
        _check_torus_links(net, where)
    return net


def _torus_coords(graph, devices, switches, where):
    if switches:
        raise UserError(f"{where}: routing=dimension_order is for a torus of devices; no switches")
    dims = tuple(
        int(checked_number(d, f"{where} dims", minimum=0, strict=True))
        for d in _sequence(graph.graph.get("dims", []), f"{where} dims")
    )
    if not dims or int(np.prod(dims)) != len(devices):
        raise UserError(
            f"{where}: routing=dimension_order needs dims=[X, Y, Z] multiplying to the "
            f"{len(devices)} devices (got {list(dims)})"
        )
    coords, seen = [], {}
    for node in devices:
        raw = graph.nodes[node].get("coord")
        if raw is None:
            raise UserError(f"{where}: device {node!r} has no coord (dimension_order routing)")
        xyz = tuple(
            int(checked_number(c, f"{where}: device {node!r} coord", minimum=-1, strict=True))
            for c in _sequence(raw, f"{where}: device {node!r} coord")
        )
        if len(xyz) != len(dims) or any(c >= d for c, d in zip(xyz, dims, strict=True)):
            raise UserError(
                f"{where}: device {node!r} coord={list(xyz)} is outside dims={list(dims)}"
            )
        if xyz in seen:
            raise UserError(f"{where}: devices {seen[xyz]!r} and {node!r} share coord={list(xyz)}")
        seen[xyz] = node
        coords.append(xyz)
    return dims, np.array(coords, dtype=np.int64)


def _check_torus_links(net: Network, where: str) -> None:
    at = {tuple(c): d for d, c in enumerate(net.coords.tolist())}
    for d, xyz in enumerate(net.coords.tolist()):
        for dim, size in enumerate(net.dims):
            if size == 1:
                continue
            nb = list(xyz)
            nb[dim] = (nb[dim] + 1) % size
            other = at[tuple(nb)]
            if (d, other) not in net._link_at:
                raise UserError(
                    f"{where}: no link between {net.devices[d]!r} and {net.devices[other]!r} "
                    f"(torus neighbours along dimension {dim}); dimension_order routing needs it"
                )


def _check_connected(graph, devices, where: str) -> None:
    reach = nx.node_connected_component(graph, devices[0])
    for node in devices[1:]:
        if node not in reach:
            raise UserError(
                f"{where}: device {node!r} cannot reach device {devices[0]!r} (the graph is "
                "disconnected); add the missing links"
            )


def _check_reach_without_relay(net: Network, where: str) -> None:
    """With ``relay: false`` traffic passes through switches only: every device pair needs a link
    or a path of switches between them (the route check assumes it)."""
    cost = net._distances()[: net.num_devices]
    bad = np.argwhere(~np.isfinite(cost))
    if bad.size:
        u, v = (net.devices[i] for i in bad[0])  # from u, to v
        raise UserError(
            f"{where}: device {u!r} cannot reach device {v!r} without passing through another "
            "device, and the graph sets relay: false (devices do not forward traffic); link them "
            "directly or through a switch, or set relay: true"
        )


def graph_cluster(name: str, device: Device, graph: nx.Graph) -> Cluster:
    """The Cluster of a graph network: its derived levels (:mod:`nest.graph.derive`) and the
    network that prices every collective."""
    net = network_from_graph(graph, name)
    levels = derive_levels(net, net.level_names)
    net.set_hierarchy([lv.fanout for lv in levels])
    return Cluster(name=name, device=device, levels=levels, network=net)


def measured_graph(table, *, latency_us: float = 5.0) -> nx.Graph:
    """A complete graph of direct links from a measured pairwise table (module docstring)."""
    if table is None or str(table).strip() in ("", "???"):
        raise UserError(
            "cluster=measured needs cluster.params.table=FILE.csv (device_a,device_b,gbps)"
        )
    file = Path(str(table)).expanduser()
    if not file.is_file():
        raise UserError(f"cluster.params.table={table}: no such file")
    default_lat = checked_number(latency_us, "cluster.params.latency_us", minimum=0.0, strict=False)
    try:
        with file.open(newline="", encoding="utf-8-sig") as handle:
            reader = csv.DictReader(handle)
            fields = [f.strip() for f in reader.fieldnames or []]
            rows = [{k.strip(): (v or "").strip() for k, v in row.items() if k} for row in reader]
    except UnicodeDecodeError as exc:
        raise UserError(
            f"cluster.params.table={table}: not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from None
    need = ("device_a", "device_b", "gbps")
    if any(f not in fields for f in need):
        raise UserError(
            f"{table}: header {fields} must name device_a, device_b, gbps (and optionally "
            "latency_us)"
        )
    order: dict = {}
    pairs: dict = {}
    for line, row in enumerate(rows, start=2):
        a, b = row["device_a"], row["device_b"]
        if not a or not b:
            raise UserError(f"{table} line {line}: device_a and device_b must be set")
        if a == b:
            raise UserError(f"{table} line {line}: device {a!r} measured with itself; remove it")
        gbps = checked_number(row["gbps"], f"{table} line {line} gbps", minimum=0.0, strict=True)
        lat = row.get("latency_us") or default_lat
        lat = checked_number(lat, f"{table} line {line} latency_us", minimum=0.0, strict=False)
        for d in (a, b):
            order.setdefault(d, len(order))
        key = (a, b) if order[a] < order[b] else (b, a)
        old = pairs.get(key)
        pairs[key] = (gbps, lat) if old is None else (min(old[0], gbps), max(old[1], lat))
    names = sorted(order, key=lambda d: _device_sort_key(d, order[d]))
    if len(names) < 2:
        raise UserError(f"{table}: needs at least two devices")
    graph = nx.Graph(name=file.stem, relay=False)  # a pair's figure is its own path
    for d in names:
        graph.add_node(d, kind="gpu")
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            got = pairs.get((a, b)) or pairs.get((b, a))
            if got is None:
                raise UserError(
                    f"{table}: no measurement between devices {a!r} and {b!r}; every pair needs one"
                )
            graph.add_edge(a, b, bw_gbps=got[0], latency_us=got[1])
    return graph


def _device_sort_key(name: str, first_seen: int):
    """Device names in numeric order when they are numbers (0, 1, ..., 10), else in the order
    the table first names them."""
    try:
        return (0, int(name))
    except ValueError:
        return (1, first_seen)
