"""The NEST artifact's per-case instance files (JSON, docs/nest_paper.md §6) as profiles.

Format (docs/nest_paper.md §6): ``nodes[t]`` / ``edges[t]`` per tensor width ``t``; node ``-1`` is
the embedding, ``0..L-1`` the blocks in chain order; ``parameterSize`` and ``activationSize`` in
bytes (fp16), ``optimalLatencyFw`` / ``optimalLatencyBw`` in **milliseconds**,
``communicationCost`` of edge ``k -> k+1`` the boundary bytes; ``ep_degree`` / ``cp_degree`` the
widths every node was measured at. What we take, and what we do not import of the artifact's own
bugs (docs/nest_paper.md §4):

- Times are converted from milliseconds to seconds here (bug 4.2 mixed the two).
- ``activationSize`` counts every operator output of the layer (bug 4.4); we take it as the
  activations *without* recomputation only. Full recomputation stores the layer's input (its
  incoming boundary bytes) and costs one more forward (the forward latency, not the backward one as
  in bug 4.5). Selective recomputation is unknown in this format: it is offered as equal to none.
- The final norm and LM head are copied into every block of the artifact's Hugging Face-traced
  models (bug 4.3: Llama-2 7B would have 10.8 B parameters). ``head_in_blocks=auto`` detects it:
  no node is tensor-parallelised (the artifact traces only its Megatron models, BERT and GPT-3,
  with tensor widths) and every block holds more parameter bytes than the embedding. Then the
  untied LM head (the size of the embedding's word table, ``V x h``) is subtracted from every block
  and held once by a head layer. The head's share of the blocks' latencies and activation bytes
  cannot be separated in the file and stays in every block (an over-estimate of every block's
  time; the planner sees it uniformly). Without the copy a zero-cost head layer closes the chain.
- Edges that skip layers (BERT's embedding -> every block: the attention mask, and -> the last
  block: the tied word embedding) are not pipeline boundaries; the shared evaluator charges p2p
  between neighbouring stages only, so they are ignored.
- Unknown in the format and left to the run's config: the optimizer (the file says SGD; ours
  defaults to Adam: ``training.optimizer=sgd`` mirrors it), the global batch (``mbsInBatch`` is
  the artifact's ``M = global_batch / (mbs * ep)``, docs/nest_paper.md §2, so the batch is
  ``mbsInBatch * ep_degree`` sequences of microbatch 1: 4096 for every instance, Mixtral's
  ``1024 * 4`` included; :func:`global_batch`), the sequence length (``model.seq_len``),
  whether the parameters held under ``ep_degree`` are expert or dense ones (all are taken as
  dense), the microbatch size of the measurement (taken as 1, as in the artifact's file names).
  The instance's cluster fields are not read: choose the cluster with ``cluster=...``.
"""

import math
from pathlib import Path

from nest.core.axes import LayerKind
from nest.core.errors import UserError
from nest.core.units import GiB, ms_to_s
from nest.profile.schema import LayerProfile, Measurement, Profile

HEAD_IN_BLOCKS = ("auto", "true", "false")


def is_artifact(d) -> bool:
    return isinstance(d, dict) and "nodes" in d and "edges" in d


NODE_FIELDS = {
    "id": "an integer: -1 the embedding, 0..L-1 the blocks",
    "parameterSize": "a number of bytes",
    "activationSize": "a number of bytes",
    "optimalLatencyFw": "the forward time, a number of milliseconds",
    "optimalLatencyBw": "the backward time, a number of milliseconds",
}
EDGE_FIELDS = {
    "sourceId": "an integer node id",
    "destId": "an integer node id",
    "communicationCost": "the boundary bytes, a number",
}


def _as_int(value):
    """An integer node id (ints, integral floats or integer strings), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return value if isinstance(value, int) else None


def _as_number(value):
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if ok and math.isfinite(value) else None


def _records(items, what: str, spec: dict[str, str], where: str) -> list[dict]:
    """``items`` checked to be a list of objects with ``spec``'s fields (ids as int, the rest
    as float); the first problem is a one-line error naming the file, the field and the fix."""
    if not isinstance(items, list):
        raise UserError(
            f"{where}: {what} is a {type(items).__name__}; expected a list of objects with "
            f"{', '.join(spec)}"
        )
    out = []
    for i, item in enumerate(items):
        at = f"{what}[{i}]"
        if not isinstance(item, dict):
            raise UserError(
                f"{where}: {at} is a {type(item).__name__} ({item!r:.60}); expected an object "
                f"with {', '.join(spec)}"
            )
        rec = dict(item)
        for key, expected in spec.items():
            if key not in item:
                raise UserError(f"{where}: {at} has no {key!r}; expected {expected}")
            convert = _as_int if key.endswith(("id", "Id")) else _as_number
            rec[key] = convert(item[key])
            if rec[key] is None:
                raise UserError(f"{where}: {at} {key}={item[key]!r}; expected {expected}")
        out.append(rec)
    return out


def _nodes(nodes_by_width: dict, where: str) -> dict[str, list[dict]]:
    return {
        w: _records(nodes, f"nodes[{w!r}]", NODE_FIELDS, where)
        for w, nodes in nodes_by_width.items()
    }


def _edges(d: dict, widths, where: str) -> dict[str, list[dict]]:
    edges = d["edges"]
    if not isinstance(edges, dict):
        raise UserError(
            f"{where}: edges is a {type(edges).__name__}; expected an object mapping each tensor "
            'width to its edge list, as nodes does ({"1": [{"sourceId": 0, "destId": 1, '
            '"communicationCost": BYTES}, ...]})'
        )
    return {w: _records(edges.get(w, []), f"edges[{w!r}]", EDGE_FIELDS, where) for w in widths}


def _chain(nodes: list, edges: list, where: str) -> tuple[dict, list[int], dict]:
    by_id = {node["id"]: node for node in nodes}
    blocks = sorted(i for i in by_id if i >= 0)
    if blocks != list(range(len(blocks))) or not blocks:
        raise UserError(f"{where}: block ids must be 0..L-1, got {blocks[:5]}...")
    cost = {(e["sourceId"], e["destId"]): e["communicationCost"] for e in edges}
    for k in range(len(blocks) - 1):
        if (k, k + 1) not in cost:
            raise UserError(f"{where}: no edge {k} -> {k + 1}; the layers do not form a chain")
    return by_id, blocks, cost


def _has_head_copy(nodes_by_width: dict) -> bool:
    tp_parallel = any(
        node.get("isTensorParallelized", False)
        for nodes in nodes_by_width.values()
        for node in nodes
    )
    if tp_parallel:
        return False
    for nodes in nodes_by_width.values():
        emb = [n for n in nodes if int(n["id"]) == -1]
        if not emb:
            return False
        if any(n["parameterSize"] <= emb[0]["parameterSize"] for n in nodes if int(n["id"]) >= 0):
            return False
    return True


def _layer(node: dict, name: str, kind: LayerKind, boundary: float, head_bytes: float = 0.0):
    params = float(node["parameterSize"]) - head_bytes
    return LayerProfile(
        name=name,
        kind=kind,
        fwd_s=ms_to_s(node["optimalLatencyFw"]),
        bwd_s=ms_to_s(node["optimalLatencyBw"]),
        param_bytes=params,
        act_none_bytes=float(node["activationSize"]),
        boundary_bytes=boundary,
    )


def _degree(d: dict, key: str, where: str) -> int:
    value = d.get(key, 1) or 1
    degree = _as_int(value)
    if degree is None or degree < 1:
        raise UserError(f"{where}: {key}={value!r}; expected a positive integer (or no {key})")
    return degree


def _measurement(nodes: dict, edges: dict, d: dict, width: str, head: bool, where: str):
    by_id, blocks, cost = _chain(nodes[width], edges[width], where)
    emb = by_id.get(-1)
    head_bytes = float(emb["parameterSize"]) if head and emb is not None else 0.0
    layers = []
    if emb is not None:
        layers.append(_layer(emb, "embedding", LayerKind.EMBEDDING, cost.get((-1, 0), 0.0)))
    hidden_bytes = cost.get((0, 1), cost.get((-1, 0), 0.0))
    for k in blocks:
        boundary = cost.get((k, k + 1), hidden_bytes if head else 0.0)
        layers.append(_layer(by_id[k], f"block{k}", LayerKind.BLOCK, boundary, head_bytes))
        if layers[-1].param_bytes < 0:
            raise UserError(
                f"{where}: block {k} holds fewer bytes than the head copy; use "
                "model.head_in_blocks=false"
            )
    layers.append(
        LayerProfile(
            name="head" if head else "head (none in file)",
            kind=LayerKind.HEAD,
            fwd_s=0.0,
            bwd_s=0.0,
            param_bytes=head_bytes,
            act_none_bytes=0.0,
            boundary_bytes=0.0,
        )
    )
    return Measurement(
        tp=int(width),
        cp=_degree(d, "cp_degree", where),
        ep=_degree(d, "ep_degree", where),
        microbatch_size=1,
        layers=tuple(layers),
    )


def global_batch(d: dict) -> int | None:
    """The instance's global batch in sequences: ``mbsInBatch * ep_degree`` (the artifact's
    ``M = global_batch / (mbs * ep)`` microbatches of ``mbs = 1``, docs/nest_paper.md §2); None
    when the file does not say or the product is not an integer."""
    batch, ep = _as_number(d.get("mbsInBatch")), _as_int(d.get("ep_degree", 1) or 1)
    if batch is None or ep is None or ep < 1 or not (batch * ep).is_integer():
        return None
    return int(batch * ep)


def _notes(d: dict, head: bool) -> tuple[str, ...]:
    mem = d.get("maxMemoryPerDevice")
    batch = global_batch(d)
    facts = [
        f"{d.get('maxDevices', '?')} devices",
        f"{mem / GiB:g} GiB per device" if isinstance(mem, int | float) else "memory ?",
        f"global batch {batch} sequences ({d['mbsInBatch']:g} microbatches x ep "
        f"{d.get('ep_degree', 1) or 1})"
        if batch is not None
        else "batch ?",
        f"optimizer {d.get('optimizerAlgorithm', '?')}",
        f"recomputation {'on' if d.get('activationRecomputation') else 'off'}",
        f"ep {d.get('ep_degree', 1)}",
    ]
    notes = ["NEST artifact instance: " + ", ".join(facts)]
    if batch is not None:
        opt = str(d.get("optimizerAlgorithm", "")).lower()
        notes.append(
            f"to mirror it: training.global_batch={batch} training.microbatch_sizes=[1]"
            + (" training.optimizer=sgd" if opt == "sgd" else "")
        )
    if head:
        notes.append(
            "the LM head copied into every block (docs/nest_paper.md §4.3) is held once by a head"
        )
    return tuple(notes)


def profile_from_artifact(
    d: dict, path: Path, *, head_in_blocks: str = "auto", name=None, seq_len=None
) -> Profile:
    where = f"model.path={path}"
    mode = str(head_in_blocks).lower()
    if mode not in HEAD_IN_BLOCKS:
        raise UserError(f"model.head_in_blocks={head_in_blocks!r}; use auto, true or false")
    nodes = d["nodes"]
    if not isinstance(nodes, dict) or not nodes:
        raise UserError(f"{where}: nodes must map tensor widths to node lists")
    for width in nodes:
        if not str(width).isdigit() or int(width) < 1:
            raise UserError(f"{where}: node key {width!r} is not a tensor width")
    nodes = _nodes(nodes, where)
    edges = _edges(d, nodes, where)
    head = _has_head_copy(nodes) if mode == "auto" else mode == "true"
    widths = sorted(nodes, key=int)
    return Profile(
        name=name or path.stem,
        seq_len=seq_len,
        dtype_bytes=2,
        tp_collectives="measured",
        measurements=tuple(
            _measurement(nodes, edges, d, w, head, f"{where} width {w}") for w in widths
        ),
        notes=_notes(d, head),
    )
