"""Measured per-layer profiles: the schema, its checks, and JSON / CSV reading and writing.

A *profile* is a list of *measurements*; each measurement is one run of the whole layer chain at
one (tensor, context, expert) width and one microbatch size, and lists every layer in chain order.
Every quantity carries its unit in the field name; times may be given in seconds (``_s``) or
milliseconds (``_ms``) and are stored in seconds; sizes are bytes (``_bytes``) per device.

Layer fields (``*`` required):

====================  ==========================================================================
``name``              label (default ``layer<i>``)
``kind``              ``embedding`` (first layer only), ``block`` or ``head`` (last layer only)
``fwd_s`` *           forward seconds of one microbatch on one device (or ``fwd_ms``)
``bwd_s`` *           backward seconds (or ``bwd_ms``)
``param_bytes`` *     parameter bytes held per device, replicated over data parallelism
``expert_param_bytes``  expert parameter bytes held per device (replicated over dp*cp/ep ranks)
``act_none_bytes`` *  stored activation bytes of one microbatch without recomputation
``act_selective_bytes``  ... with selective recomputation (attention core); absent: unknown
``act_full_bytes``    ... with full recomputation; absent: the layer's input (previous boundary)
``recompute_selective_s``  extra backward seconds of selective recomputation (or ``_ms``)
``wgrad_s``           the weight-gradient part of ``bwd_s`` (or ``_ms``; at most ``bwd_s``): the
                      W pass of the zero-bubble schedules; absent: 0 (ZB-H1 then takes 1F1B's time)
``boundary_bytes`` *  bytes of the layer's output each device sends to the next layer's devices
``transient_bytes``   short-lived buffer at the layer's peak beyond stored activations (logits)
``tied_copy_param_bytes``  head only: bytes of the tied word-embedding copy the last stage holds
                      when it is not the embedding's stage (Megatron keeps such a copy)
``fwd_flops``         forward FLOPs one device executes (for MFU; absent: MFU not reported)
====================  ==========================================================================

Measurement fields: ``tp``, ``cp``, ``ep`` (default 1), ``microbatch_size`` (default 1),
``layers``. Profile fields (JSON): ``format`` (``nest-profile-v1``), ``name``, ``seq_len``
(tokens per sequence, for tokens/s), ``dtype_bytes`` (bytes per parameter, default 2),
``tp_collectives`` (``measured`` | ``modelled``, see :mod:`nest.profile.model`),
``measurements``. CSV: one row per (measurement, layer) with the measurement fields as columns;
the profile fields come from the Hydra config (``model.name``, ``model.seq_len``, ...).
"""

import csv
import json
import math
from dataclasses import dataclass, fields
from pathlib import Path

from nest.core.axes import LayerKind
from nest.core.errors import UserError
from nest.core.files import atomic_path, write_text

FORMAT = "nest-profile-v1"
TIME_UNITS = {"s": 1.0, "ms": 1e-3}
TIME_STEMS = ("fwd", "bwd", "recompute_selective", "wgrad")
BYTE_STEMS = (
    "param",
    "expert_param",
    "act_none",
    "act_selective",
    "act_full",
    "boundary",
    "transient",
    "tied_copy_param",
)
REQUIRED = ("fwd_s", "bwd_s", "param_bytes", "act_none_bytes", "boundary_bytes")
MEASUREMENT_KEYS = ("tp", "cp", "ep", "microbatch_size")
PROFILE_KEYS = ("format", "name", "seq_len", "dtype_bytes", "tp_collectives", "measurements")
TP_COLLECTIVES = ("measured", "modelled")


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerProfile:
    """One layer of one measurement; seconds and bytes per device and microbatch."""

    name: str
    kind: LayerKind
    fwd_s: float
    bwd_s: float
    param_bytes: float
    act_none_bytes: float
    boundary_bytes: float
    expert_param_bytes: float = 0.0
    act_selective_bytes: float | None = None
    act_full_bytes: float | None = None
    recompute_selective_s: float | None = None
    wgrad_s: float | None = None
    """The weight-gradient part of ``bwd_s`` (None: not measured, taken as 0)."""
    transient_bytes: float = 0.0
    tied_copy_param_bytes: float = 0.0
    fwd_flops: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Measurement:
    tp: int = 1
    cp: int = 1
    ep: int = 1
    microbatch_size: int = 1
    layers: tuple[LayerProfile, ...]

    @property
    def width(self) -> tuple[int, int, int]:
        return (self.tp, self.cp, self.ep)


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    name: str
    measurements: tuple[Measurement, ...]
    seq_len: int | None = None
    dtype_bytes: int = 2
    tp_collectives: str = "measured"
    notes: tuple[str, ...] = ()
    """Facts about where the profile came from (printed with the run's summary)."""

    def __post_init__(self) -> None:
        check_profile(self)


LAYER_FIELDS = tuple(f.name for f in fields(LayerProfile))


def _bad(where: str, message: str) -> UserError:
    return UserError(f"{where}: {message}")


def _number(where: str, key: str, value) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(float(value)):
        raise _bad(where, f"{key}={value!r} must be a finite number")
    if value < 0:
        raise _bad(where, f"{key}={value!r} is negative; measured times and sizes are >= 0")
    return float(value)


def parse_layer(raw: dict, where: str, index: int) -> LayerProfile:
    """A layer from a JSON object / CSV row, units converted to seconds and bytes."""
    out: dict = {"name": str(raw.get("name") or f"layer{index}")}
    kind = raw.get("kind", "block")
    try:
        out["kind"] = LayerKind(kind)
    except ValueError:
        raise _bad(where, f"kind={kind!r}; use embedding, block or head") from None
    given_as: dict[str, str] = {}  # a converted field -> the key that gave it
    for key, value in raw.items():
        if key in ("name", "kind") or value is None or value == "":
            continue
        if key == "fwd_flops":
            out[key] = _number(where, key, value)
            continue
        stem, _, unit = key.rpartition("_")
        if stem in TIME_STEMS and unit in TIME_UNITS:
            field_s = f"{stem}_s"
            if field_s in given_as:
                raise _bad(
                    where,
                    f"{given_as[field_s]}={raw[given_as[field_s]]!r} and {key}={value!r} give "
                    f"{stem} twice; keep one of them",
                )
            given_as[field_s] = key
            out[field_s] = _number(where, key, value) * TIME_UNITS[unit]
        elif stem in BYTE_STEMS and unit == "bytes":
            out[key] = _number(where, key, value)
        elif stem in TIME_STEMS:
            raise _bad(where, f"field {key!r} has unit {unit!r}; use {stem}_s or {stem}_ms")
        elif stem in BYTE_STEMS:
            raise _bad(where, f"field {key!r} has unit {unit!r}; sizes are {stem}_bytes (bytes)")
        else:
            raise _bad(where, f"unknown field {key!r}; layer fields are {', '.join(REQUIRED)}, ...")
    missing = [k for k in REQUIRED if k not in out]
    if missing:
        raise _bad(where, f"missing {', '.join(missing)} (required: {', '.join(REQUIRED)})")
    if out.get("wgrad_s", 0.0) > out["bwd_s"]:
        raise _bad(
            where,
            f"wgrad_s={out['wgrad_s']!r} exceeds bwd_s={out['bwd_s']!r}; the weight gradient is "
            "part of the backward",
        )
    return LayerProfile(**out)


def _degree(where: str, key: str, value) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise _bad(where, f"{key}={value!r} must be a positive integer")
    return value


def check_profile(p: Profile) -> None:
    """The structural rules of a profile (one line per violation, first one raised)."""
    where = f"profile {p.name}"
    if not p.measurements:
        raise _bad(where, "has no measurements")
    if p.tp_collectives not in TP_COLLECTIVES:
        raise _bad(where, f"tp_collectives={p.tp_collectives!r}; use measured or modelled")
    if p.dtype_bytes not in (1, 2, 4):
        raise _bad(where, f"dtype_bytes={p.dtype_bytes!r}; use 1, 2 or 4")
    if p.seq_len is not None and (not isinstance(p.seq_len, int) or p.seq_len < 1):
        raise _bad(where, f"seq_len={p.seq_len!r} must be a positive integer")
    seen = set()
    first = p.measurements[0]
    for m in p.measurements:
        key = (*m.width, m.microbatch_size)
        at = f"{where} (tp={m.tp} cp={m.cp} ep={m.ep} microbatch_size={m.microbatch_size})"
        if key in seen:
            raise _bad(at, "is measured twice; give each width and microbatch size once")
        seen.add(key)
        if len(m.layers) != len(first.layers):
            raise _bad(
                at,
                f"has {len(m.layers)} layers but the first measurement has "
                f"{len(first.layers)}; every measurement lists the whole chain",
            )
        for i, (a, b) in enumerate(zip(m.layers, first.layers, strict=True)):
            if a.kind is not b.kind:
                raise _bad(at, f"layer {i} is a {a.kind} but a {b.kind} in the first measurement")
    kinds = [layer.kind for layer in first.layers]
    if LayerKind.BLOCK not in kinds:
        raise _bad(where, "has no block layer")
    for i, kind in enumerate(kinds):
        if kind is LayerKind.EMBEDDING and i != 0:
            raise _bad(where, f"layer {i} is an embedding; only the first layer may be one")
        if kind is LayerKind.HEAD and i != len(kinds) - 1:
            raise _bad(where, f"layer {i} is a head; only the last layer may be one")


def _measurement(raw: dict, where: str) -> Measurement:
    unknown = set(raw) - {*MEASUREMENT_KEYS, "layers"}
    if unknown:
        raise _bad(where, f"unknown key(s) {sorted(unknown)}; use {list(MEASUREMENT_KEYS)}, layers")
    degrees = {k: _degree(where, k, raw.get(k, 1)) for k in MEASUREMENT_KEYS}
    layers = raw.get("layers")
    if not isinstance(layers, list) or not layers:
        raise _bad(where, "layers must be a non-empty list of layer objects")
    parsed = []
    for i, raw_layer in enumerate(layers):
        if not isinstance(raw_layer, dict):
            raise _bad(f"{where} layer {i}", "must be an object with the layer fields")
        parsed.append(parse_layer(raw_layer, f"{where} layer {i}", i))
    return Measurement(**degrees, layers=tuple(parsed))


def profile_from_dict(d: dict, *, where: str = "profile", **override) -> Profile:
    """A profile from its JSON object; ``override`` (non-None) replaces top-level fields."""
    if not isinstance(d, dict):
        raise _bad(where, "must be a JSON object")
    unknown = set(d) - set(PROFILE_KEYS)
    if unknown:
        raise _bad(where, f"unknown key(s) {sorted(unknown)}; use {list(PROFILE_KEYS)}")
    fmt = d.get("format", FORMAT)
    if fmt != FORMAT:
        raise _bad(where, f"format={fmt!r}; this reader knows {FORMAT!r}")
    raw = d.get("measurements")
    if not isinstance(raw, list) or not raw:
        raise _bad(where, "measurements must be a non-empty list")
    top = {k: d[k] for k in ("name", "seq_len", "dtype_bytes", "tp_collectives") if k in d}
    top.update({k: v for k, v in override.items() if v is not None})
    top.setdefault("name", "profile")
    return Profile(
        measurements=tuple(_measurement(m, f"{where} measurement {i}") for i, m in enumerate(raw)),
        **top,
    )


def _layer_dict(layer: LayerProfile) -> dict:
    out = {}
    for name in LAYER_FIELDS:
        value = getattr(layer, name)
        if value is None:
            continue
        out[name] = str(value) if name == "kind" else value
    return out


def profile_to_dict(p: Profile) -> dict:
    return {
        "format": FORMAT,
        "name": p.name,
        "seq_len": p.seq_len,
        "dtype_bytes": p.dtype_bytes,
        "tp_collectives": p.tp_collectives,
        "measurements": [
            {
                **{k: getattr(m, k) for k in MEASUREMENT_KEYS},
                "layers": [_layer_dict(layer) for layer in m.layers],
            }
            for m in p.measurements
        ],
    }


def write_profile(p: Profile, path: Path) -> None:
    """JSON or CSV by the file's suffix."""
    if path.suffix.lower() == ".csv":
        columns = [*MEASUREMENT_KEYS, *LAYER_FIELDS]
        with atomic_path(path) as tmp, tmp.open("w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            for m in p.measurements:
                for layer in m.layers:
                    writer.writerow(
                        {**{k: getattr(m, k) for k in MEASUREMENT_KEYS}, **_layer_dict(layer)}
                    )
    else:
        write_text(path, json.dumps(profile_to_dict(p), indent=1) + "\n")


def _csv_value(text: str):
    text = text.strip()
    if text == "":
        return None
    try:
        value = float(text)
    except ValueError:
        return text
    return int(value) if value.is_integer() and "." not in text and "e" not in text else value


def read_csv_profile(path: Path, **top) -> Profile:
    """A profile from CSV rows grouped by (tp, cp, ep, microbatch_size), in file order."""
    with path.open(newline="", encoding="utf-8-sig") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise _bad(f"model.path={path}", "has no rows (CSV with a header row expected)")
    groups: dict[tuple, list] = {}
    for i, row in enumerate(rows, start=2):
        raw = {k.strip(): _csv_value(v or "") for k, v in row.items() if k is not None}
        key = tuple(_degree(f"{path} line {i}", k, raw.pop(k, None) or 1) for k in MEASUREMENT_KEYS)
        groups.setdefault(key, []).append(raw)
    measurements = [
        {**dict(zip(MEASUREMENT_KEYS, key, strict=True)), "layers": layers}
        for key, layers in groups.items()
    ]
    top = {k: v for k, v in top.items() if v is not None}
    top.setdefault("name", path.stem)
    return profile_from_dict({"measurements": measurements}, where=f"model.path={path}", **top)
