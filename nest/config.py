"""Config schemas (Hydra structured configs) and their conversion to SI domain objects.

Preset files carry human units with the unit in the key (``peak_tflops``, ``hbm_gb`` /
``hbm_gib``, ``bw_gbps``, ``latency_us``); :func:`build_problem` converts them, in one place, with
:mod:`nest.units`. The schemas reject unknown keys and wrong types when Hydra composes the config.
"""

import dataclasses
from dataclasses import dataclass, field, make_dataclass
from math import prod
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from nest import units
from nest.axes import Optimizer
from nest.errors import UserError
from nest.hardware import Device
from nest.layers import AnalyticModel
from nest.model import ModelSpec
from nest.problem import Problem, Training
from nest.topology import Cluster, Level


@dataclass
class DeviceConfig:
    name: str = MISSING
    peak_tflops: float = MISSING
    """Peak dense bf16 matmul throughput, TFLOP/s (datasheet)."""
    hbm_gb: float | None = None
    """HBM capacity in decimal GB, when the datasheet says GB (set this or ``hbm_gib``)."""
    hbm_gib: float | None = None
    """HBM capacity in GiB, when the source says GiB."""
    hbm_bw_gbps: float = MISSING
    """HBM bandwidth, GB/s (decimal)."""
    matmul_efficiency: float = 1.0
    """Achieved fraction of the peak on the model's matmuls, (0, 1]."""
    memory_reserve_gib: float = 0.0
    """HBM not available to the model (CUDA context, allocator, framework), GiB."""


@dataclass
class LevelConfig:
    name: str = MISSING
    fanout: int | None = None
    """Blocks of the level below per block of this level; null (top level only): derived from
    ``cluster.devices``."""
    bw_gbps: float = MISSING
    """Per-device bandwidth per direction, GB/s (decimal)."""
    latency_us: float = 1.0
    oversubscription: float = 1.0


@dataclass
class ClusterConfig:
    name: str = MISSING
    devices: int | None = None
    """Total devices; the top level's fan-out follows from it when left null."""
    device: DeviceConfig = field(default_factory=DeviceConfig)
    levels: list[LevelConfig] = field(default_factory=list)
    graph_path: str | None = None
    """A network graph file (networkx node-link .json or .graphml; :mod:`nest.graph.build`):
    the cluster is that graph, not ``levels``."""
    topology: str | None = None
    """A graph generator (``tpuv4_torus``, ``rail_optimized``, ``leaf_spine``), ``measured``
    (a pairwise bandwidth table), ``graph`` (the file ``graph_path``) or ``hierarchy``
    (``levels`` as a graph): :mod:`nest.graph`."""
    params: dict[str, Any] = field(default_factory=dict)
    """The generator's parameters (:mod:`nest.graph.generators`; ``measured``: ``table``,
    ``latency_us``)."""


# The model schema is the ModelSpec's own fields (same names, types and defaults), so the two
# cannot drift apart.
ModelConfig = make_dataclass(
    "ModelConfig",
    [
        (f.name, f.type, field(default=MISSING if f.default is dataclasses.MISSING else f.default))
        for f in dataclasses.fields(ModelSpec)
    ],
)


@dataclass
class HfModelConfig:
    """``model=hf``: a Hugging Face ``config.json`` (read as JSON only; :mod:`nest.hf`)."""

    source: str = "hf"
    config_path: str | None = None
    name: str | None = None
    """Default: the config's ``_name_or_path``, else its folder (``config.json``) or file name."""
    seq_len: int | None = None
    """Training length. Default: the config's pre-training context when it states one, else
    ``max_position_embeddings`` (``n_positions`` for GPT-2) up to 4096, with a notice when the
    model accepts more (:mod:`nest.hf`)."""


@dataclass
class ProfileModelConfig:
    """``model=profile``: measured per-layer profiles (:mod:`nest.profile`)."""

    source: str = "profile"
    path: str | None = None
    name: str | None = None
    seq_len: int | None = None
    tp_collectives: str | None = None
    """``measured`` (times include TP traffic) or ``modelled``; null: the file's (or measured)."""
    microbatch_scaling: str = "linear"
    head_in_blocks: str = "auto"
    """NEST artifact files only: the LM head copied into every block (auto / true / false)."""


@dataclass
class TrainingConfig:
    global_batch: int = 1024
    """Sequences per iteration."""
    microbatch_sizes: list[int] = field(default_factory=lambda: [1, 2, 4])
    optimizer: str = "adam"
    grad_bytes: int = 2
    overlap_grad_sync: bool = False
    sequence_parallel: bool = True
    flash_attention: bool = True


def register_schemas() -> None:
    """Register the schemas so preset YAML files can extend them (``defaults: [x_schema]``)."""
    cs = ConfigStore.instance()
    cs.store(group="cluster", name="cluster_schema", node=ClusterConfig)
    cs.store(group="device", name="device_schema", node=DeviceConfig)
    cs.store(group="model", name="model_schema", node=ModelConfig)
    cs.store(group="model", name="hf_model_schema", node=HfModelConfig)
    cs.store(group="model", name="profile_model_schema", node=ProfileModelConfig)
    cs.store(group="training", name="training_schema", node=TrainingConfig)


def _plain(cfg: Any) -> dict:
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    return dict(cfg)


def _require(where: str, key: str, value, ok: bool, rule: str) -> None:
    if not ok:
        shown = f"{value:g}" if isinstance(value, int | float) else repr(value)
        raise UserError(f"{where}: {key}={shown} {rule}")


def build_device(cfg: Any) -> Device:
    c = _plain(cfg)
    where = f"device {c.get('name')}"
    if (c.get("hbm_gb") is None) == (c.get("hbm_gib") is None):
        raise UserError(
            f"device {c.get('name')}: give exactly one of hbm_gb or hbm_gib "
            f"(got hbm_gb={c.get('hbm_gb')}, hbm_gib={c.get('hbm_gib')})"
        )
    for key in ("peak_tflops", "hbm_bw_gbps"):
        _require(
            where,
            key,
            c.get(key),
            isinstance(c.get(key), int | float) and c[key] > 0,
            "must be > 0",
        )
    for key in ("hbm_gb", "hbm_gib"):
        if c.get(key) is not None:
            _require(where, key, c[key], c[key] > 0, "must be > 0")
    eff = c.get("matmul_efficiency", 1.0)
    _require(where, "matmul_efficiency", eff, 0 < eff <= 1, "must be in (0, 1]")
    reserve = c.get("memory_reserve_gib", 0.0)
    capacity_gib = (
        c["hbm_gib"] if c.get("hbm_gib") is not None else (c.get("hbm_gb") or 0) * 1e9 / 2**30
    )
    _require(
        where,
        "memory_reserve_gib",
        reserve,
        0 <= reserve < capacity_gib,
        f"must be >= 0 and below the HBM ({capacity_gib:g} GiB)",
    )
    hbm = (
        units.gb_to_bytes(c["hbm_gb"])
        if c.get("hbm_gb") is not None
        else units.gib_to_bytes(c["hbm_gib"])
    )
    return Device(
        name=c["name"],
        peak_flops_per_s=units.tflops_to_flops_per_s(c["peak_tflops"]),
        hbm_bytes=hbm,
        hbm_bw_bytes_per_s=units.gbps_to_bytes_per_s(c["hbm_bw_gbps"]),
        matmul_efficiency=float(c.get("matmul_efficiency", 1.0)),
        memory_reserve_bytes=units.gib_to_bytes(c.get("memory_reserve_gib", 0.0)),
    )


def build_cluster(cfg: Any) -> Cluster:
    c = _plain(cfg)
    name = c.get("name", "cluster")
    if c.get("graph_path") or (c.get("topology") and c.get("topology") != "hierarchy"):
        from nest.graph import build_graph_cluster

        return build_graph_cluster(c, build_device(c["device"]))
    levels_cfg = c.get("levels") or []
    if not levels_cfg:
        raise UserError(f"cluster {name}: give at least one level under cluster.levels")
    if not 1 <= len(levels_cfg) <= 8:
        raise UserError(f"cluster {name}: {len(levels_cfg)} levels; use 1 to 8")
    fanouts = [lv.get("fanout") for lv in levels_cfg]
    devices = c.get("devices")
    if devices is not None and (not isinstance(devices, int) or devices < 1):
        raise UserError(f"cluster.devices={devices!r} must be a positive integer")
    for i, f in enumerate(fanouts):
        if f is not None and (not isinstance(f, int) or f < 1):
            raise UserError(f"cluster {name}: level {i} fanout={f!r} must be a positive integer")
        if f is None and i != len(fanouts) - 1:
            raise UserError(
                f"cluster {name}: only the top level's fanout may be null (level {i} is null)"
            )
    inner = prod(f for f in fanouts if f is not None)
    if fanouts[-1] is None:
        if devices is None:
            raise UserError(f"cluster {name}: the top level's fanout is null; set cluster.devices")
        if devices % inner:
            raise UserError(
                f"cluster.devices={devices} is not a multiple of the inner fan-outs "
                f"{fanouts[:-1]} (product {inner}); use a multiple of {inner}"
            )
        fanouts[-1] = devices // inner
    elif devices is not None and devices != inner:
        raise UserError(
            f"cluster {name}: fan-outs {fanouts} multiply to {inner} but cluster.devices={devices};"
            " make them agree (or set the top level's fanout to null)"
        )
    for i, lv in enumerate(levels_cfg):
        where = f"cluster.levels[{i}] ({lv.get('name')})"
        bw = lv.get("bw_gbps")
        _require(where, "bw_gbps", bw, isinstance(bw, int | float) and bw > 0, "must be > 0")
        lat = lv.get("latency_us", 0.0)
        _require(where, "latency_us", lat, lat >= 0, "must be >= 0")
        over = lv.get("oversubscription", 1.0)
        _require(where, "oversubscription", over, over >= 1, "must be >= 1")
    levels = tuple(
        Level(
            name=lv.get("name", f"level{i}"),
            fanout=fanouts[i],
            bw_bytes_per_s=units.gbps_to_bytes_per_s(lv["bw_gbps"]),
            latency_s=units.us_to_s(lv.get("latency_us", 0.0)),
            oversubscription=float(lv.get("oversubscription", 1.0)),
        )
        for i, lv in enumerate(levels_cfg)
    )
    cluster = Cluster(name=name, device=build_device(c["device"]), levels=levels)
    if c.get("topology") == "hierarchy":  # the same hierarchy, priced as a graph
        from nest.graph import build_graph_cluster

        return build_graph_cluster(c, cluster.device, hierarchy=cluster)
    return cluster


def build_model_spec(cfg: Any) -> ModelSpec:
    c = _plain(cfg)
    return ModelSpec(**c)


def _with_provenance(model, seq_len_source: str, notes=()):
    """Attach where the model's sequence length came from (``seq_len_source``, printed in the
    summary and written to report.json) and one-line notices (``notes``, printed after the
    summary) to a built model."""
    model.seq_len_source = seq_len_source
    model.notes = tuple(getattr(model, "notes", ())) + tuple(notes)
    return model


def build_model(cfg: Any, training: Training):
    """The model a problem uses: a preset spec, a Hugging Face config, or a measured profile."""
    c = _plain(cfg)
    source = c.pop("source", "spec")
    if source == "hf":
        from nest.hf import load_hf_model

        hf = load_hf_model(c.get("config_path"), name=c.get("name"), seq_len=c.get("seq_len"))
        model = AnalyticModel(hf.spec, flash_attention=training.flash_attention)
        return _with_provenance(model, hf.seq_len_source, hf.notes)
    if source == "profile":
        from nest.profile import load_profile_model

        model = load_profile_model(
            c.get("path"),
            name=c.get("name"),
            seq_len=c.get("seq_len"),
            tp_collectives=c.get("tp_collectives"),
            head_in_blocks=c.get("head_in_blocks", "auto"),
            microbatch_scaling=c.get("microbatch_scaling", "linear"),
        )
        given = "model.seq_len" if c.get("seq_len") else "the profile file"
        return _with_provenance(model, given if model.seq_len else "not given")
    model = AnalyticModel(build_model_spec(c), flash_attention=training.flash_attention)
    return _with_provenance(model, "model.seq_len")


def build_training(cfg: Any) -> Training:
    c = _plain(cfg)
    try:
        optimizer = Optimizer(c.get("optimizer", "adam"))
    except ValueError:
        raise UserError(
            f"training.optimizer={c.get('optimizer')!r}; use one of {[o.value for o in Optimizer]}"
        ) from None
    sizes = c.get("microbatch_sizes", [1])
    if isinstance(sizes, int):
        sizes = [sizes]
    return Training(
        global_batch=c["global_batch"],
        microbatch_sizes=tuple(sorted(set(sizes))),
        optimizer=optimizer,
        grad_bytes=c.get("grad_bytes", 2),
        overlap_grad_sync=bool(c.get("overlap_grad_sync", False)),
        sequence_parallel=bool(c.get("sequence_parallel", True)),
        flash_attention=bool(c.get("flash_attention", True)),
    )


def build_problem(cfg: Any) -> Problem:
    """Problem from a composed config with ``cluster``, ``model`` and ``training`` sections."""
    training = build_training(cfg["training"])
    return Problem(
        model=build_model(cfg["model"], training),
        cluster=build_cluster(cfg["cluster"]),
        training=training,
    )
