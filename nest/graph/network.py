"""A cluster's network as a graph: links, routing, and the cost of concurrent collectives.

A :class:`Network` holds devices (GPU / TPU chips, ids ``0..N-1`` in the file's order) and
switches joined by undirected links, each with a bandwidth per direction and a latency. It prices
what the shared cost model asks of a hierarchy (:mod:`nest.cost.collectives`), but on the graph:

**Routing.** Every link costs ``latency + 1 MiB / bandwidth`` (the time a 1 MiB message takes
on it), a route is a least-cost path, and traffic between two devices is split evenly at every
node over all next hops that lie on a least-cost path (ties within a relative 1e-9): equal-cost
multipath routing as switches do it, per hop (Hopps, RFC 2992, "Analysis of an Equal-Cost
Multi-Path Algorithm", 2000; the link cost inverse to bandwidth is OSPF's convention, RFC 2328
§C.3, here with the latency added so that a faster but longer path loses to a direct one).
Switches are non-blocking: only links carry limits. Devices forward traffic too (a torus has no
switches), unless the graph says ``relay: false`` (a measured table: every pair's figure is its
own path). A torus may instead use **dimension-order routing** (``routing: dimension_order``):
each dimension in turn along its shorter direction, the positive one when both are equally
short; the deterministic minimal routing of k-ary n-cubes (Dally and Towles, "Principles and
Practices of Interconnection Networks", 2004, ch. 14).

**Collectives** (:meth:`Network.group_classes`) run the hierarchical algorithms of
:mod:`nest.cost.collectives` over the cluster's *derived hierarchy* (:mod:`nest.graph.derive`),
with the traffic routed on the graph:

- reduce-scatter / all-gather of ``S`` bytes: level by level, the members of a group inside one
  level-``l`` block form rings, one per position inside their level-``(l-1)`` blocks (the
  hierarchical algorithm's sub-rings); each member sends ``(k_l - 1) / k_l / prod_{j<l} k_j S``
  bytes to its successor at that level (``k``: the group's level split, as on a hierarchy).
  All-reduce costs twice that (reduce-scatter up, all-gather down).
- all-to-all: every ordered pair of members exchanges ``S / n`` bytes, the pairs whose lowest
  common level is ``l`` all at once, level after level.
- the time of a level is ``max over links (load / bandwidth) S + latency``: the busiest link on
  the routes the group uses sets its pace (a fluid model), and the latency term is a ring's
  ``(size - 1)`` steps times its slowest hop (all-to-all: the most peers a member meets at that
  level times the slowest pair). A group's collective sums its levels, so it is ``a S + c``.

**Link sharing.** All groups of one kind in one pipeline rank run their collective at once
(synchronous parallelism: the 8 tensor groups of a stage all-reduce together), so the load on a
link is the sum over *every* group of that kind, and each group pays the busiest link on its own
routes. Pipeline ranks are not synchronised with each other, different kinds run one after
another, so neither shares links with the other (a stated simplification). A stage boundary's
transfers (every device pair of the two ranks at once) share links the same way, priced in both
directions (the worse one counts). On a graph that *is* a hierarchy (a switch per block and
level, each device on its own link to each: :func:`nest.graph.generators.hierarchy_graph`) no two
groups of a kind share a link and every formula reduces to the hierarchical model's (tested).

What the cost model keeps per group kind is the set of *cost classes*
(:class:`nest.core.fabric.GroupClass`: the affine forms of one group) with dominated ones
dropped, so a collective's time is still "the slowest group", now
with contention inside it. A :class:`Network` is the :class:`nest.core.fabric.Fabric` the cost
model asks.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from nest.core.alphabeta import affine_time_s
from nest.core.fabric import GroupClass, LinkClass, class_forms
from nest.core.hierarchy import row_splits, translate_down

REFERENCE_BYTES = 2**20
"""Routing metric: a link costs its latency plus the time it takes to carry this many bytes."""
TIE = 1e-9
"""Relative tolerance under which two routes cost the same (equal-cost multipath)."""
ROUTINGS = ("ecmp", "dimension_order")


@dataclass(frozen=True, slots=True)
class Route:
    """The links a pair's traffic crosses, the share of it on each, and its latency (the slowest
    of its paths, seconds)."""

    links: np.ndarray
    fracs: np.ndarray
    latency_s: float


@dataclass(slots=True)
class Network:
    """A validated graph network (module docstring). Build one with
    :func:`nest.graph.build.network_from_graph`; the derived hierarchy is attached with
    :meth:`set_hierarchy` before the network prices anything."""

    name: str
    devices: tuple
    """Node keys of the devices, in device-id order."""
    switches: tuple
    link_src: np.ndarray
    """Directed links ``2 e`` and ``2 e + 1`` are undirected edge ``e`` both ways; node indices
    ``0..N-1`` are the devices, then the switches."""
    link_dst: np.ndarray
    link_bw: np.ndarray
    """Bytes/s per direction."""
    link_lat: np.ndarray
    """Seconds."""
    routing: str = "ecmp"
    relay: bool = True
    """Devices forward other devices' traffic (a torus; NVLink to a NIC). False: only switches
    do (a measured table's direct pairs)."""
    symmetric: bool = False
    """The graph's promise that moving every device by a whole top-level child block of the
    derived hierarchy, ``d -> (d + k B) mod N``, and that mapping a device to device 0 while
    keeping the derived blocks, are automorphisms that keep routes (the generators' graphs)."""
    dims: tuple = ()
    """Torus dimensions (dimension-order routing)."""
    coords: np.ndarray | None = None
    """Per device its torus coordinate (dimension-order routing)."""
    level_names: tuple = ()
    positions: dict = field(default_factory=dict)
    """Node key -> (x, y) for drawing, when the graph gives them."""
    fanouts: tuple = ()
    _block: np.ndarray = field(default=None, repr=False)
    _routes: dict = field(default_factory=dict, repr=False)
    _groups: dict = field(default_factory=dict, repr=False)
    _p2p: dict = field(default_factory=dict, repr=False)
    _aligned: dict = field(default_factory=dict, repr=False)
    _dist: np.ndarray | None = field(default=None, repr=False)
    _out: list = field(default_factory=list, repr=False)
    _link_at: dict = field(default_factory=dict, repr=False)
    _bounds: tuple | None = field(default=None, repr=False)
    _lat_list: list = field(default_factory=list, repr=False)

    kind = "graph"
    level_symmetric = False
    """The rings of the hierarchical collectives are ordered by device id, so a tree automorphism
    that reorders ids can change a cost on a graph (:mod:`nest.graph.placements`)."""
    priced_by_levels = False
    offers_deepep = False
    """The derived levels number the devices; the links price the traffic."""

    def __post_init__(self) -> None:
        n_nodes = len(self.devices) + len(self.switches)
        self.link_src = np.asarray(self.link_src, dtype=np.int64)
        self.link_dst = np.asarray(self.link_dst, dtype=np.int64)
        self.link_bw = np.asarray(self.link_bw, dtype=float)
        self.link_lat = np.asarray(self.link_lat, dtype=float)
        order = np.lexsort((self.link_dst, self.link_src))
        self._out = [[] for _ in range(n_nodes)]
        for e in order.tolist():
            self._out[int(self.link_src[e])].append(e)
        self._out = [np.array(links, dtype=np.int64) for links in self._out]
        self._link_at = {
            (int(a), int(b)): e
            for e, (a, b) in enumerate(zip(self.link_src, self.link_dst, strict=True))
        }

    # ------------------------------------------------------------------ identity
    __hash__ = object.__hash__

    def __eq__(self, other) -> bool:
        return self is other

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def num_links(self) -> int:
        return len(self.link_src)

    @property
    def weight(self) -> np.ndarray:
        """Routing cost of each directed link, seconds (module docstring)."""
        return self.link_lat + REFERENCE_BYTES / self.link_bw

    def set_hierarchy(self, fanouts: Sequence[int]) -> None:
        """Attach the derived hierarchy (innermost first); its block sizes define the
        collectives' levels."""
        self.fanouts = tuple(int(f) for f in fanouts)
        self._block = np.concatenate([[1], np.cumprod(self.fanouts)]).astype(np.int64)
        self._groups.clear()
        self._bounds = None

    def describe(self, levels=None) -> str:
        """The graph's size and routing, and the cluster's derived ``levels`` when given."""
        n_edges = self.num_links // 2
        out = (
            f"graph of {self.num_devices} devices, {len(self.switches)} switches, {n_edges} links,"
            f" {self.routing.replace('_', '-')} routing"
        )
        if levels:
            derived = ", ".join(
                f"{lv.name} x{lv.fanout} @ {lv.bw_bytes_per_s / 1e9:.3g} GB/s" for lv in levels
            )
            out += f"; derived levels {derived}"
        return out

    def translated(self, devices) -> np.ndarray:
        """Moved down by whole top-level child blocks of the derived hierarchy where the graph
        is :attr:`symmetric` (the move is then an automorphism keeping routes); else the
        devices where they are (a graph need not look the same from every block)."""
        devices = np.asarray(devices, dtype=np.int64)
        if not self.symmetric:
            return devices
        return translate_down(devices, int(self._block[len(self.fanouts) - 1]))

    # ------------------------------------------------------------------ routing
    def _distances(self) -> np.ndarray:
        """Least routing cost from every node to every device (``[node, device]``), by
        Bellman-Ford relaxations vectorised over the destinations."""
        if self._dist is None:
            self._dist = least_costs(self, self.weight)
        return self._dist

    def route(self, u: int, v: int) -> Route:
        """The route of the traffic from device ``u`` to device ``v`` (cached)."""
        key = (u, v)
        got = self._routes.get(key)
        if got is None:
            if u == v:
                got = Route(np.zeros(0, dtype=np.int64), np.zeros(0), 0.0)
            elif self.routing == "dimension_order":
                got = self._dor_route(u, v)
            else:
                got = self._ecmp_route(u, v)
            self._routes[key] = got
        return got

    def _tight(self, x: int, col: np.ndarray, target: int) -> np.ndarray:
        """Out-links of node ``x`` on a least-cost path towards the destination of ``col``."""
        links = self._out[x]
        w = self.link_lat[links] + REFERENCE_BYTES / self.link_bw[links]
        here = col[x]
        ahead = col[self.link_dst[links]]
        if not self.relay:  # no device but the destination on the way
            ahead = np.where(self.link_dst[links] < self.num_devices, np.inf, ahead)
            ahead[self.link_dst[links] == target] = 0.0
        return links[np.abs(w + ahead - here) <= TIE * here]

    def _ecmp_route(self, u: int, v: int) -> Route:
        col = self._distances()[:, v]
        if not np.isfinite(col[u]):
            raise AssertionError(f"device {u} cannot reach device {v}")  # checked on load
        mass = {u: 1.0}
        latency = {u: 0.0}
        hops: dict = {}
        stack, seen = [u], {u}
        while stack:  # the nodes of the least-cost paths from u
            x = stack.pop()
            if x == v:
                continue
            hops[x] = self._tight(x, col, v)
            for e in hops[x].tolist():
                y = int(self.link_dst[e])
                if y not in seen:
                    seen.add(y)
                    stack.append(y)
        loads: dict = {}
        for x in sorted(hops, key=lambda node: -col[node]):  # every predecessor first
            out = hops[x]
            share = mass.get(x, 0.0) / len(out)
            for e in out.tolist():
                y = int(self.link_dst[e])
                loads[e] = loads.get(e, 0.0) + share
                mass[y] = mass.get(y, 0.0) + share
                latency[y] = max(latency.get(y, 0.0), latency[x] + float(self.link_lat[e]))
        links = np.array(sorted(loads), dtype=np.int64)
        return Route(links, np.array([loads[e] for e in links.tolist()]), latency[v])

    def _dor_route(self, u: int, v: int) -> Route:
        coords, dims = self.coords, self.dims
        step, link = self._torus_steps()
        x, latency = u, 0.0
        links = []
        for d, size in enumerate(dims):
            delta = int((coords[v][d] - coords[x][d]) % size)
            if delta == 0:
                continue
            sign, hops = (1, delta) if 2 * delta <= size else (0, size - delta)
            for _ in range(hops):
                e = link[d][sign][x]
                links.append(e)
                latency += self._lat_list[e]
                x = step[d][sign][x]
        order = np.array(sorted(links), dtype=np.int64)
        return Route(order, np.ones(len(order)), latency)

    def _torus_steps(self):
        """Per dimension and direction (0: minus, 1: plus), each device's neighbour and the link
        to it (dimension-order routing's tables)."""
        got = self._routes.get("steps")
        if got is None:
            at = {tuple(int(c) for c in xyz): d for d, xyz in enumerate(self.coords)}
            step, link = [], []
            for d, size in enumerate(self.dims):
                per_sign_step, per_sign_link = [], []
                for sign in (-1, 1):
                    nb, ln = [], []
                    for xyz in self.coords.tolist():
                        target = list(xyz)
                        target[d] = (target[d] + sign) % size
                        z = at[tuple(target)]
                        nb.append(z)
                        ln.append(self._link_at.get((at[tuple(xyz)], z), -1))
                    per_sign_step.append(nb)
                    per_sign_link.append(ln)
                step.append(per_sign_step)
                link.append(per_sign_link)
            got = (step, link)
            self._routes["steps"] = got
            self._lat_list = self.link_lat.tolist()
        return got

    def _routes_of(self, src: np.ndarray, dst: np.ndarray):
        """Concatenated routes of pairs: (links, fracs, pair index per entry, latency per pair)."""
        routes = [self.route(int(a), int(b)) for a, b in zip(src, dst, strict=True)]
        if not routes:
            empty = np.zeros(0, dtype=np.int64)
            return empty, np.zeros(0), empty, np.zeros(0)
        sizes = [len(r.links) for r in routes]
        links = np.concatenate([r.links for r in routes])
        fracs = np.concatenate([r.fracs for r in routes])
        owner = np.repeat(np.arange(len(routes)), sizes)
        return links, fracs, owner, np.array([r.latency_s for r in routes])

    def _busiest(self, links, weights, owner, n_owners: int) -> np.ndarray:
        """Per owner, the largest ``load / bandwidth`` over the links its entries cross, the
        load on a link summing every entry's weight (all owners at once)."""
        out = np.zeros(n_owners)
        if len(links):
            loads = np.bincount(links, weights=weights, minlength=self.num_links)
            np.maximum.at(out, owner, loads[links] / self.link_bw[links])
        return out

    # ------------------------------------------------------------------ groups
    def group_splits(self, groups: np.ndarray) -> np.ndarray:
        """Per group (row, sorted), its level split on the derived hierarchy
        (:func:`nest.core.hierarchy.row_splits`)."""
        return row_splits(groups, self._block)

    def group_classes(self, groups, *, all_to_all: bool = False) -> tuple[GroupClass, ...]:
        """The cost classes of every group of one kind in one pipeline rank, running at once
        (rows of ``groups``; module docstring), dominated classes dropped, sorted."""
        g = np.sort(np.asarray(groups, dtype=np.int64), axis=1)
        if g.shape[1] <= 1:
            return ()
        g = g[np.lexsort(g.T[::-1])]
        key = (g.shape, g.tobytes(), all_to_all)
        got = self._groups.get(key)
        if got is None:
            rs_a, rs_c = self._ring_forms(g)
            if all_to_all:
                a2a_a, a2a_c = self._a2a_forms(g)
                forms = (rs_a, rs_c, a2a_a, a2a_c)
                rows = zip(*(f.tolist() for f in forms), strict=True)
            else:
                rows = zip(rs_a.tolist(), rs_c.tolist(), strict=True)
            got = tuple(GroupClass(*v) for v in pareto(list(rows)))
            self._groups[key] = got
        return got

    def _ring_forms(self, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per group, ``(a, c)`` of a reduce-scatter (module docstring)."""
        rows, n = g.shape
        k = self.group_splits(g)
        below = np.hstack([np.ones((rows, 1)), np.cumprod(k, axis=1)[:, :-1]])
        a, c = np.zeros(rows), np.zeros(rows)
        cols = np.arange(n)
        for lv in range(len(self.fanouts)):
            if (k[:, lv] <= 1).all():
                continue
            amount = (k[:, lv] - 1) / k[:, lv] / below[:, lv]
            sub = g // self._block[lv]
            starts = np.ones_like(sub, dtype=bool)
            starts[:, 1:] = sub[:, 1:] != sub[:, :-1]
            pos = cols - np.maximum.accumulate(np.where(starts, cols, 0), axis=1)
            src, dst, ring, ring_row, sizes = rings_of(g, g // self._block[lv + 1], pos)
            if not len(src):
                continue
            links, fracs, owner, latency = self._routes_of(src, dst)
            edge_row = ring_row[ring]
            a += self._busiest(links, fracs * amount[edge_row][owner], edge_row[owner], rows)
            ring_lat = np.zeros(len(sizes))
            np.maximum.at(ring_lat, ring, latency)
            level_c = np.zeros(rows)
            np.maximum.at(level_c, ring_row, (sizes - 1) * ring_lat)
            c += level_c
        return a, c

    def _a2a_forms(self, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per group, ``(a, c)`` of an all-to-all of ``S`` bytes per member (module
        docstring)."""
        rows, n = g.shape
        a, c = np.zeros(rows), np.zeros(rows)
        left = g[:, :, None]
        right = g[:, None, :]
        common = np.full((rows, n, n), -1, dtype=np.int64)
        for lv in reversed(range(len(self.fanouts))):
            differ = (left // self._block[lv]) != (right // self._block[lv])
            common = np.where(differ, np.maximum(common, lv), common)
        for lv in range(len(self.fanouts)):
            mask = common == lv
            if not mask.any():
                continue
            r_idx, i_idx, j_idx = np.nonzero(mask)
            links, fracs, owner, latency = self._routes_of(g[r_idx, i_idx], g[r_idx, j_idx])
            a += self._busiest(links, fracs / n, r_idx[owner], rows)
            slowest = np.zeros(rows)
            np.maximum.at(slowest, r_idx, latency)
            c += mask.sum(axis=2).max(axis=1) * slowest
        return a, c

    def forms(self, op: str, classes) -> tuple[np.ndarray, np.ndarray]:
        """``(a, c)`` arrays of ``op`` over cost classes (:func:`nest.core.fabric.class_forms`)."""
        return class_forms(op, classes)

    # ------------------------------------------------------------------ pipeline boundaries
    def p2p_time_s(self, n_bytes, cls: LinkClass):
        """``a S + c`` of one pair's class."""
        return affine_time_s(cls.a, cls.c, n_bytes)

    def p2p_classes(self, a_devices, b_devices) -> tuple[LinkClass, ...]:
        """The classes of a stage boundary: device ``a[i]`` sends to ``b[i]`` for every ``i``
        at once, in each direction (module docstring)."""
        a = np.asarray(a_devices, dtype=np.int64).ravel()
        b = np.asarray(b_devices, dtype=np.int64).ravel()
        ka, kb = a.tobytes(), b.tobytes()
        key = (ka, kb) if ka <= kb else (kb, ka)
        got = self._p2p.get(key)
        if got is None:
            keep = a != b
            a, b = a[keep], b[keep]
            values = []
            for src, dst in ((a, b), (b, a)):
                links, fracs, owner, latency = self._routes_of(src, dst)
                rho = self._busiest(links, fracs, owner, len(src))
                values += list(zip(rho.tolist(), latency.tolist(), strict=True))
            got = tuple(LinkClass(*v) for v in pareto(values))
            self._p2p[key] = got
        return got

    # ------------------------------------------------------------------ floors
    def aligned_classes(self, tp: int) -> tuple[GroupClass, ...]:
        """The classes of every aligned block of ``tp`` consecutive ids, each priced alone (no
        other group sharing its links: a floor of its cost in any rank)."""
        got = self._aligned.get(tp)
        if got is None:
            n = self.num_devices - self.num_devices % tp
            blocks = np.arange(n).reshape(-1, tp)
            got = tuple(sorted({cls for b in blocks for cls in self.group_classes(b[None, :])}))
            self._aligned[tp] = got
        return got

    def pair_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Per derived level ``l``: an upper bound ``R_l`` on the rate (bytes/s) of the traffic
        of any device pair whose lowest common level is ``l`` when it runs alone, and a lower
        bound ``L_l`` on its latency (:mod:`nest.graph.floors` proves both)."""
        if self._bounds is None:
            self._bounds = pair_bounds(self)
        return self._bounds

    def floor_forms(self, op: str, splits) -> tuple[np.ndarray, np.ndarray]:
        """``(a, c)`` with ``a S + c`` at most the cost of ``op`` on any group of split ``k``
        (rows of ``splits``), wherever it lies and whatever shares its links
        (:mod:`nest.graph.floors`)."""
        from nest.graph.floors import floor_forms

        return floor_forms(self, op, splits)

    def p2p_floor_s(self, n_bytes, level: int):
        """A floor on a stage boundary's transfer of ``n_bytes`` between device pairs whose
        lowest common level is ``level``."""
        rate, latency = self.pair_bounds()
        return affine_time_s(1.0 / rate[level], latency[level], n_bytes)

    # ------------------------------------------------------------------ the derivation's probe
    def level_pattern(self, inner: int, fanout: int) -> tuple[float, float]:
        """Rate (bytes/s per device) and latency (s) of a level of ``fanout`` blocks of
        ``inner`` consecutive devices: every device sends to the device at its offset in the next
        block of its ring of ``fanout`` blocks, all at once (the traffic of the hierarchical
        collectives at that level)."""
        ids = np.arange(self.num_devices).reshape(-1, fanout, inner)
        src = ids.ravel()
        dst = np.roll(ids, -1, axis=1).ravel()
        links, fracs, owner, latency = self._routes_of(src, dst)
        rho = self._busiest(links, fracs, np.zeros_like(owner), 1)[0]
        return (1.0 / rho if rho > 0 else float("inf")), float(latency.max())


def rings_of(g: np.ndarray, block: np.ndarray, pos: np.ndarray):
    """The rings of one level: members of a row with the same level block and the same position
    in their sub-block, in id order. Returns the directed ring edges (source and destination
    devices and ring index per edge), each ring's row and size (rings of one member have no
    edges and are left out)."""
    rows, n = g.shape
    row = np.repeat(np.arange(rows), n)
    blk, p, dev = block.ravel(), pos.ravel(), g.ravel()
    order = np.lexsort((dev, p, blk, row))
    row, blk, p, dev = row[order], blk[order], p[order], dev[order]
    new = np.ones(len(dev), dtype=bool)
    new[1:] = (row[1:] != row[:-1]) | (blk[1:] != blk[:-1]) | (p[1:] != p[:-1])
    ring_id = np.cumsum(new) - 1
    sizes = np.bincount(ring_id)
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(dev) - 1)
    inner = np.flatnonzero(~new)  # entry i closes the edge (i - 1) -> i
    src = np.concatenate([dev[inner - 1], dev[last]])
    dst = np.concatenate([dev[inner], dev[first]])
    ring = np.concatenate([ring_id[inner], ring_id[last]])
    keep = sizes[ring] >= 2
    ring_row = row[first]
    big = sizes >= 2
    renumber = np.cumsum(big) - 1
    return src[keep], dst[keep], renumber[ring[keep]], ring_row[big], sizes[big]


def pareto(values: list[tuple]) -> list[tuple]:
    """The tuples no other tuple dominates (at least as large in every entry), sorted: the maximum
    of ``a S + c`` over them equals the maximum over all of them for every ``S >= 0``."""
    unique = sorted(set(values))
    return [
        v
        for v in unique
        if not any(w != v and all(x >= y for x, y in zip(w, v, strict=True)) for w in unique)
    ]


def least_costs(net: Network, weight: np.ndarray) -> np.ndarray:
    """Least cost from every node to every device over links of the given non-negative
    ``weight`` (``[node, device]``; Bellman-Ford, the relaxation vectorised over the
    destinations and done per source node with ``minimum.reduceat``)."""
    n_nodes = len(net.devices) + len(net.switches)
    n_dev = net.num_devices
    order = np.argsort(net.link_src, kind="stable")
    src, dst, w = net.link_src[order], net.link_dst[order], weight[order]
    starts = np.flatnonzero(np.r_[True, src[1:] != src[:-1]])
    owners = src[starts]
    dist = np.full((n_nodes, n_dev), np.inf)
    dist[np.arange(n_dev), np.arange(n_dev)] = 0.0
    chunk = max(1, 4_000_000 // max(1, len(src)))
    into_device = dst < n_dev
    for lo in range(0, n_dev, chunk):
        part = dist[:, lo : lo + chunk]
        # without relays a device is only ever the end of a path: reached, never passed through
        arrive = np.where(dst[into_device, None] == np.arange(lo, lo + part.shape[1]), 0.0, np.inf)
        for _ in range(n_nodes):
            ahead = part[dst]
            if not net.relay:
                ahead[into_device] = arrive
            cand = np.minimum.reduceat(w[:, None] + ahead, starts, axis=0)
            better = cand < part[owners]
            if not better.any():
                break
            part[owners] = np.where(better, cand, part[owners])
    return dist


def pair_bounds(net: Network) -> tuple[np.ndarray, np.ndarray]:
    from nest.graph.floors import pair_bounds as compute

    return compute(net)
