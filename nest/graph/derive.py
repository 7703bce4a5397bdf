"""The hierarchy a graph cluster's structured placements and baselines use, derived from the graph.

NEST's space is structured: a rank order lays the ranks out over device ids read as mixed-radix
coordinates of a hierarchy (:func:`nest.core.plan.place`), so a graph cluster needs levels. They are
derived bottom-up over the devices **in device-id order** (the file's order; generators number
devices so that well-connected ones are consecutive):

1. Start with blocks of ``s = 1`` device.
2. For every ``f`` dividing ``N / s``, probe a level of ``f`` blocks: every device sends to the
   device at its offset in the next of the ``f`` consecutive blocks of its group (a ring), all
   devices at once, routed on the graph with link sharing
   (:meth:`nest.graph.network.Network.level_pattern`): the traffic the hierarchical collectives
   put on that level. Its rate (bytes/s per device) and latency characterise the level.
3. Keep the **largest** ``f`` whose probe is best: the highest rate, and among those the least
   latency (relative tolerance 1e-9). Then ``s *= f``; repeat until ``s = N``.

So a level grows while the devices it joins are as well connected as its closest ones: on a DGX
graph the 8 GPUs of a node (a ring over 16 would cross InfiniBand at a lower rate), then every
node; on a torus numbered x fastest, a whole x ring (its wrap-around link makes a ring of 8
one-hop; 4 consecutive chips would close their ring over 3 hops), then y, then z; on a
leaf-spine fabric the nodes of one leaf (a ring over two leaves adds the spine's hops), then
the leaves, whose probe, with every device crossing the spine at once, shows the
oversubscription. Each derived level's bandwidth and latency are its probe's, which the
baselines' simplified views read; every plan is still scored on the graph itself.
"""

from nest.core.axes import divisors
from nest.core.topology import Level
from nest.graph.network import Network

TOLERANCE = 1e-9


def derive_levels(net: Network, names: tuple = ()) -> tuple[Level, ...]:
    """The derived hierarchy's levels, innermost first (module docstring); ``names`` label
    them when there are as many as levels."""
    n = net.num_devices
    chosen: list[tuple[int, float, float]] = []
    inner = 1
    while inner < n:
        probes = [(f, *net.level_pattern(inner, f)) for f in divisors(n // inner)[1:]]
        best_rate = max(rate for _, rate, _ in probes)
        fast = [p for p in probes if p[1] >= best_rate * (1 - TOLERANCE)]
        best_lat = min(lat for _, _, lat in fast)
        good = [p for p in fast if p[2] <= best_lat * (1 + TOLERANCE) + 1e-15]
        f, rate, lat = max(good)
        chosen.append((f, rate, lat))
        inner *= f
    if not chosen:  # a single device
        chosen = [(1, 1e12, 0.0)]
    if len(names) != len(chosen):
        names = tuple(f"level{i}" for i in range(len(chosen)))
    return tuple(
        Level(name=str(name), fanout=f, bw_bytes_per_s=float(rate), latency_s=float(lat))
        for name, (f, rate, lat) in zip(names, chosen, strict=True)
    )
