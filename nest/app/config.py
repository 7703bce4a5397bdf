"""Config schemas (Hydra structured configs) and their conversion to SI domain objects.

Preset files carry human units with the unit in the key (``peak_tflops``, ``hbm_gb`` /
``hbm_gib``, ``bw_gbps``, ``latency_us``); :func:`build_problem` converts them, in one place, with
:mod:`nest.core.units`. The schemas reject unknown keys and wrong types when Hydra composes the
config;
:func:`check_config` refuses what composition lets through (keys added with ``+`` that nothing
reads, non-finite numbers, empty solver lists), and :func:`build_problem` refuses sizes beyond
the documented limits (:data:`LIMITS`) before building anything in proportion to them.
"""

import copy
import dataclasses
import difflib
import functools
import inspect
import json
import math
from dataclasses import dataclass, field, make_dataclass
from math import prod
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nest.core import units
from nest.core.axes import Optimizer
from nest.core.errors import UserError
from nest.core.hardware import Device
from nest.core.layers import AnalyticModel
from nest.core.model import ModelSpec
from nest.core.problem import Problem, Training
from nest.core.topology import Cluster, Level


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
    hbm_efficiency: float = 1.0
    """Fraction of ``hbm_bw_gbps`` a streaming kernel achieves (published STREAM-style
    micro-benchmark), (0, 1]; 1.0: the nameplate."""
    matmul_efficiency: float = 1.0
    """Achieved fraction of the peak on the model's matmuls, (0, 1]."""
    memory_reserve_gib: float = 0.0
    """HBM not available to the model (CUDA context, communication buffers), GiB."""
    memory_margin: float = 0.0
    """Fraction of the HBM kept free for the allocator's fragmentation, [0, 1)."""
    compute_model: str = "flat"
    """``flat``: every FLOP at ``matmul_efficiency``; ``shape``: GEMM tiles and waves, attention
    by sequence length (nest/core/kernels.py; needs the fields below)."""
    sm_count: int = 0
    """Streaming multiprocessors (datasheet)."""
    gemm_ceiling: float = 1.0
    """Fraction of peak the best-shaped large GEMMs reach (published micro-benchmark)."""
    kernel_overhead_us: float = 0.0
    """Fixed microseconds of every kernel (from a published GEMM measurement table)."""
    attention_efficiency: list = field(default_factory=list)
    """[[key length, fraction of peak], ...] of the fused attention kernel (published)."""
    attention_bwd_efficiency: list = field(default_factory=list)
    """[[key length, fraction of peak], ...] of its backward kernel, FLOPs counted as 2.5 times
    the forward's (published); empty: the forward's fractions."""
    fp8_peak_tflops: float | None = None
    """Peak dense FP8 matmul throughput, TFLOP/s (datasheet); null: no FP8 tensor cores."""
    fp8_gemm_ceiling: float | None = None
    """Fraction of the FP8 peak the best-shaped large FP8 GEMMs reach (published
    micro-benchmark); needed with ``fp8_peak_tflops``."""
    fp8_kernel_overhead_us: float | None = None
    """``shape``: fixed microseconds of an FP8 GEMM kernel (from a published FP8 GEMM table, as
    ``kernel_overhead_us`` from its bf16 rows); null: ``kernel_overhead_us``."""
    mxfp8: bool = False
    """The tensor cores take MXFP8 (Blackwell)."""
    fp8_any_layout: bool = False
    """Per-tensor-scaled FP8 GEMMs take any operand layout: no transposed FP8 copies
    (Transformer Engine ``non_tn_fp8_gemm_supported``, compute capability >= 10.0)."""
    kernel_figures_peak_tflops: float | None = None
    """``shape``: the peak of the chip the four figures above were published for; a device whose
    ``peak_tflops`` differs (e.g. another chip given by overrides) does not use them."""
    host_link_gbps: float | None = None
    """Device-to-host-memory link, GB/s (decimal) per direction (datasheet: PCIe Gen5 x16 64,
    NVLink-C2C 450); null: no host link, nothing offloaded."""


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
    bw_efficiency: float = 1.0
    """Fraction of the line rate collectives achieve (published nccl-tests bus bandwidth); 1:
    nameplate."""
    in_network: str | None = None
    """An in-network all-reduce the level's switches offer: ``nvls`` (NVLink SHARP) or
    ``sharp`` (InfiniBand SHARP); used when ``cluster.nvls`` / ``cluster.sharp`` is on."""
    in_network_gbps: float | None = None
    """Its achieved algorithm bandwidth per device, GB/s (a published run's all-reduce busbw
    over ``2 (n-1) / n``)."""


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
    nvls: bool = False
    """All-reduces use NVLink SHARP on the levels that offer it (``in_network: nvls``)."""
    sharp: bool = False
    """All-reduces use InfiniBand SHARP on the levels that offer it (``in_network: sharp``)."""


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
    """``model=hf``: a Hugging Face ``config.json`` (read as JSON only; :mod:`nest.app.hf`)."""

    source: str = "hf"
    config_path: str | None = None
    name: str | None = None
    """Default: the config's ``_name_or_path``, else its folder (``config.json``) or file name."""
    seq_len: int | None = None
    """Training length. Default: the config's pre-training context when it states one, else
    ``max_position_embeddings`` (``n_positions`` for GPT-2) up to 4096, with a notice when the
    model accepts more (:mod:`nest.app.hf`)."""


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


TRAINING_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Training)}
"""The training options' defaults, stated once (:class:`nest.core.problem.Training`)."""


@dataclass
class TrainingConfig:
    """``training``: the options of :class:`nest.core.problem.Training`, with its defaults."""

    global_batch: int = 1024
    """Sequences per iteration."""
    microbatch_sizes: list[int] = field(default_factory=lambda: [1, 2, 4])
    optimizer: str = TRAINING_DEFAULTS["optimizer"].value
    grad_bytes: int = TRAINING_DEFAULTS["grad_bytes"]
    overlap_grad_sync: bool = TRAINING_DEFAULTS["overlap_grad_sync"]
    sequence_parallel: bool = TRAINING_DEFAULTS["sequence_parallel"]
    flash_attention: bool = TRAINING_DEFAULTS["flash_attention"]
    fused_loss: bool = TRAINING_DEFAULTS["fused_loss"]
    cross_entropy_loss_fusion: bool = TRAINING_DEFAULTS["cross_entropy_loss_fusion"]
    tp_comm_overlap: bool = TRAINING_DEFAULTS["tp_comm_overlap"]
    cp_comm_overlap: bool = TRAINING_DEFAULTS["cp_comm_overlap"]
    ep_comm_overlap: bool = TRAINING_DEFAULTS["ep_comm_overlap"]
    reshard_after_forward: bool = TRAINING_DEFAULTS["reshard_after_forward"]
    zero3_prefetch_params: float | None = TRAINING_DEFAULTS["zero3_prefetch_params"]
    zero3_runtime: str = TRAINING_DEFAULTS["zero3_runtime"]
    moe_routing: str = TRAINING_DEFAULTS["moe_routing"]
    moe_dispatcher: str = TRAINING_DEFAULTS["moe_dispatcher"]
    precision: str = TRAINING_DEFAULTS["precision"]
    fp8_recipe: str = TRAINING_DEFAULTS["fp8_recipe"]
    fp8_param_gather: bool = TRAINING_DEFAULTS["fp8_param_gather"]
    cpu_adam_params_per_s: float = TRAINING_DEFAULTS["cpu_adam_params_per_s"]
    """Parameters per second the host CPU updates for one device whose optimizer state is
    offloaded (ZeRO-Offload's CPU-Adam rate over 8 devices per host)."""


@dataclass
class RunConfig:
    """The top level of a run's config (``conf/config.yaml``): the four groups and the switches."""

    solver: Any = MISSING
    cluster: Any = MISSING
    model: Any = MISSING
    training: Any = MISSING
    seed: int = 0
    """Planners that draw random numbers take it."""
    print_summary: bool = True
    simulate: bool = False
    explain: bool = False
    export: Any = None
    """``megatron`` | ``torchtitan`` | a list of them."""
    plots: bool = False
    robust: Any = False
    """``true`` or ``false`` (nest/analysis/robust.py checks it): re-score the plan and its
    ``solver.top_k`` alternatives under the cost model's uncertainty."""
    robustness: Any = None
    """The settings of ``robust=true`` (samples, seed, ranges; nest/analysis/robust.py checks
    them)."""


def register_schemas() -> None:
    """Register the schemas so preset YAML files can extend them (``defaults: [x_schema]``)."""
    cs = ConfigStore.instance()
    cs.store(name="run_schema", node=RunConfig)
    cs.store(group="cluster", name="cluster_schema", node=ClusterConfig)
    cs.store(group="device", name="device_schema", node=DeviceConfig)
    cs.store(group="model", name="model_schema", node=ModelConfig)
    cs.store(group="model", name="hf_model_schema", node=HfModelConfig)
    cs.store(group="model", name="profile_model_schema", node=ProfileModelConfig)
    cs.store(group="training", name="training_schema", node=TrainingConfig)


CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
"""The presets: ``conf/<group>/<name>.yaml``."""


def load_preset(group: str, name: str) -> dict:
    """The preset ``conf/<group>/<name>.yaml`` as the CLI composes it (Hydra: its defaults list,
    nested presets such as a cluster's device, and the schema defaults), as a plain dict the
    caller may change."""
    return copy.deepcopy(_composed(group, name))


@functools.cache
def _composed(group: str, name: str) -> dict:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_schemas()
    if GlobalHydra.instance().is_initialized():  # inside the CLI: its search path is conf/
        cfg = compose(config_name=f"{group}/{name}")
    else:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name=f"{group}/{name}")
    return _plain(cfg[group])


def _plain(cfg: Any) -> dict:
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    return dict(cfg)


def _shown(value) -> str:
    """A value as the user would type it on the command line (``nan``, ``[1, 2]``, ``'x'``)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return f"{value:g}" if isinstance(value, float) else str(value)
    if isinstance(value, list | dict):
        return json.dumps(value, default=str)
    return repr(value)


def _require(where: str, key: str, value, ok: bool, rule: str) -> None:
    if not ok:
        raise UserError(f"{where}: {key}={_shown(value)} {rule}")


def _number(where: str, key: str, value, ok, rule: str) -> float:
    """The one conversion every number of a device or network preset goes through: a real,
    finite number (``nan`` and ``inf`` are refused) for which ``ok`` holds, as a float."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise UserError(f"{where}: {key}={_shown(value)} must be a finite number")
    _require(where, key, value, ok(value), rule)
    return float(value)


# ------------------------------------------------------------------------------------------------
# Size limits: a run beyond them is refused at once instead of enumerating for minutes
# ------------------------------------------------------------------------------------------------

MAX_BLOCKS = 256
"""Transformer blocks (``model.layers``) at most: twice the 126 of Llama 3.1 405B, the deepest
preset (large LLMs have about a hundred). The planners' work grows faster than the chain: on
dgx_8x8 a 256-block Llama-2-wide model takes the DP seconds, a 512-block one over ten minutes
(docs/errors.md). Deep research models (DeepNet's 1,000 layers, arXiv 2203.00555) are beyond."""
MAX_DEVICES = 131_072
"""Devices (``cluster.devices``, or the product of the fan-outs) at most: 8x the 16,384 H100s
Llama 3 was trained on (Dubey et al., arXiv 2407.21783, §3.3.1). Candidate degrees are the
divisors of the device count, found by trial division."""
MAX_GLOBAL_BATCH = 1_048_576
"""Sequences per iteration (``training.global_batch``) at most: 16x the largest published
batch we know of, LAMB's 65,536 sequences for BERT (You et al., arXiv 1904.00962, Table 1).
Data-parallel degrees are the divisors of the batch, found by trial division."""
MAX_EXPERTS = 65_536
"""Experts per MoE block (``model.num_experts``) at most; published MoE LLMs have at most a few
hundred (DeepSeek-V3: 256, arXiv 2412.19437). Expert degrees are the divisors of this count."""
MAX_EXACT_INT = 2**53
"""Any integer in the config at most (in magnitude): the largest the cost model, which computes
in double precision, holds exactly."""

LIMITS = {
    "model.layers": MAX_BLOCKS,
    "model.num_experts": MAX_EXPERTS,
    "cluster.devices": MAX_DEVICES,
    "training.global_batch": MAX_GLOBAL_BATCH,
}
"""The documented size limits, by the key that sets each (docs/errors.md)."""


def _within_limit(key: str, value: int, what: str) -> None:
    limit = LIMITS[key]
    if value > limit:
        raise UserError(
            f"{key}={value} is beyond the limit of {limit:,} {what} "
            "(nest/app/config.py LIMITS): no "
            "real run is this large, and planning one would enumerate for minutes or hours; "
            f"use at most {limit}"
        )


# ------------------------------------------------------------------------------------------------
# What Hydra's composition lets through: unknown keys added with +, nan/inf, empty solver lists
# ------------------------------------------------------------------------------------------------

HYDRA_KEYS = ("_target_", "_recursive_", "_convert_", "_partial_", "_args_")


def planner_options(cls: type) -> dict[str, inspect.Parameter] | None:
    """The keyword options a planner class takes, following ``**kwargs`` up its bases (e.g.
    ``NestPlanner(**space)`` -> ``SpacePlanner``); None when they end in ``**kwargs`` nobody
    names."""
    options: dict[str, inspect.Parameter] = {}
    for klass in cls.__mro__:
        if klass is object:
            return None
        if "__init__" not in vars(klass):
            continue
        params = inspect.signature(klass.__init__).parameters
        for name, param in list(params.items())[1:]:  # skip self
            if param.kind not in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                options.setdefault(name, param)
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            return options
    return None


def _unknown_key(path: str, value, known, owner: str) -> UserError:
    parent, _, key = path.rpartition(".")
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean {parent + '.' if parent else ''}{close[0]}? " if close else ""
    return UserError(
        f"{path}={_shown(value)} is not a setting of {owner}; {hint}its settings are "
        f"{', '.join(known)} (a key added with + must be one of them)"
    )


def _check_keys(node, path: str, known: list[str] | None, owner: str) -> None:
    """Refuse keys of ``node`` (a section of the composed config) that nothing reads, then look
    inside: a structured node knows its schema's fields."""
    if isinstance(node, ListConfig):
        for i in range(len(node)):
            _check_keys(node[i], f"{path}.{i}", None, owner)
        return
    if not isinstance(node, DictConfig):
        return
    schema = OmegaConf.get_type(node)
    if known is None and dataclasses.is_dataclass(schema):
        known = [f.name for f in dataclasses.fields(schema)]
        owner = path or "the run"
    for key in node:
        where = f"{path}.{key}" if path else str(key)
        if known is not None and key not in known and key not in HYDRA_KEYS:
            raise _unknown_key(where, OmegaConf.to_container(node, resolve=True)[key], known, owner)
        if not path and key == "solver":
            _check_solver(node.solver)
        elif key not in HYDRA_KEYS and not OmegaConf.is_missing(node, key):
            # a required value left as ??? has nothing inside: its builder says what to give
            # (cluster=measured's cluster.params.table)
            _check_keys(node[key], where, None, owner)


def _check_solver(solver: DictConfig) -> None:
    """The solver section has no schema: its keys are the planner class's options, and a list
    there restricts what the planner may choose, so an empty one leaves it nothing."""
    from nest.planner import checked_solver  # the same checks as building the planner

    _, cls = checked_solver(solver)
    options = planner_options(cls)
    name = solver.get("name", cls.__name__)
    values = OmegaConf.to_container(solver, resolve=True)
    for key, value in values.items():
        if key in HYDRA_KEYS:
            continue
        if options is not None and key not in options:
            raise _unknown_key(
                f"solver.{key}", value, list(options), f"the {name} planner ({cls.__name__})"
            )
        if isinstance(value, list) and not value:
            default = options[key].default if options and key in options else None
            fix = (
                "or null for the planner's default"
                if default is None or default is inspect.Parameter.empty
                else f"(its default is {_shown(list(default))})"
            )
            raise UserError(
                f"solver.{key}=[] is empty, which leaves {name} nothing to choose from; give at "
                f"least one value {fix}"
            )


def _leaves(data, path: str = ""):
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _leaves(value, f"{path}.{key}" if path else str(key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from _leaves(value, f"{path}.{i}")
    else:
        yield path, data


def check_config(cfg: DictConfig) -> None:
    """Refuse, with one line naming the key and the value, what Hydra's composition lets through:

    - a key nothing reads (``+foo=1``, ``+model.foo=1``, ``+solver.foo=1``): the top level and
      every structured section are checked against their schema's fields, the solver section
      against its planner class's options;
    - a non-finite number (``nan``, ``inf``) or an integer beyond :data:`MAX_EXACT_INT`, anywhere;
    - an empty list in the solver section (every list there restricts what the planner may
      choose: ``solver.tp=[]`` would leave it nothing);
    - an interpolation that does not resolve (``solver.seed='${nope}'``).
    """
    try:
        data = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "config"
        raise UserError(f"{key}: {str(exc).splitlines()[0]}") from None
    for section in ("solver", "cluster", "model", "training"):
        if not isinstance(data.get(section), dict):
            raise UserError(
                f"{section}={_shown(data.get(section))} is not a mapping of settings; its preset "
                f"file (conf/{section}/) must hold key: value lines"
            )
    for path, value in _leaves(data):
        if isinstance(value, float) and not math.isfinite(value):
            raise UserError(f"{path}={_shown(value)} is not a finite number; give a finite value")
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_EXACT_INT:
            raise UserError(
                f"{path}={value} is beyond 2**53 = {MAX_EXACT_INT:,}, the largest integer the "
                "cost model computes with exactly; no real setting is this large"
            )
    _check_keys(cfg, "", [f.name for f in dataclasses.fields(RunConfig)], "the run")


def build_device(cfg: Any) -> Device:
    c = _plain(cfg)
    where = f"device {c.get('name')}"
    if (c.get("hbm_gb") is None) == (c.get("hbm_gib") is None):
        raise UserError(
            f"device {c.get('name')}: give exactly one of hbm_gb or hbm_gib "
            f"(got hbm_gb={c.get('hbm_gb')}, hbm_gib={c.get('hbm_gib')})"
        )

    peak_tflops = _physical(where, c, "peak_tflops")
    hbm_bw_gbps = _physical(where, c, "hbm_bw_gbps")
    if c.get("hbm_gb") is not None:
        hbm = units.gb_to_bytes(_physical(where, c, "hbm_gb"))
    else:
        hbm = units.gib_to_bytes(_physical(where, c, "hbm_gib"))
    eff = _number(
        where,
        "matmul_efficiency",
        c.get("matmul_efficiency", 1.0),
        lambda v: 0 < v <= 1,
        "must be in (0, 1]",
    )
    hbm_eff = _number(
        where,
        "hbm_efficiency",
        c.get("hbm_efficiency", 1.0),
        lambda v: 0 < v <= 1,
        "must be in (0, 1]",
    )
    reserve_bytes, margin_bytes = _reserve_bytes(where, c, hbm)
    compute_model, notes = _compute_model(c, peak_tflops)
    return Device(
        name=c["name"],
        notes=notes,
        peak_flops_per_s=units.tflops_to_flops_per_s(peak_tflops),
        hbm_bytes=hbm,
        hbm_bw_bytes_per_s=units.gbps_to_bytes_per_s(hbm_bw_gbps),
        hbm_efficiency=hbm_eff,
        matmul_efficiency=eff,
        memory_reserve_bytes=reserve_bytes,
        allocator_margin_bytes=margin_bytes,
        compute_model=compute_model,
        sm_count=int(
            _number(where, "sm_count", c.get("sm_count", 0) or 0, lambda v: v >= 0, "must be >= 0")
        ),
        gemm_ceiling=_number(
            where,
            "gemm_ceiling",
            c.get("gemm_ceiling", 1.0),
            lambda v: 0 < v <= 1,
            "must be in (0, 1]",
        ),
        kernel_overhead_s=units.us_to_s(
            _number(
                where,
                "kernel_overhead_us",
                c.get("kernel_overhead_us", 0.0),
                lambda v: v >= 0,
                "must be >= 0",
            )
        ),
        attention_efficiency=_attention_table(
            where, "attention_efficiency", c.get("attention_efficiency") or []
        ),
        attention_bwd_efficiency=_attention_table(
            where, "attention_bwd_efficiency", c.get("attention_bwd_efficiency") or []
        ),
        host_link_bw_bytes_per_s=(
            None
            if c.get("host_link_gbps") is None
            else units.gbps_to_bytes_per_s(_physical(where, c, "host_link_gbps"))
        ),
        **_fp8_figures(where, c),
    )


def _fp8_figures(where: str, c: dict) -> dict:
    """The FP8 fields of a device: none, or a peak inside the physical range with its GEMM
    ceiling."""
    if c.get("fp8_peak_tflops") is None:
        if c.get("fp8_kernel_overhead_us") is not None:
            raise UserError(
                f"{where}: fp8_kernel_overhead_us={c['fp8_kernel_overhead_us']} needs "
                "fp8_peak_tflops (a device without FP8 GEMMs has no FP8 kernel time)"
            )
        return {"mxfp8": bool(c.get("mxfp8", False))}  # no FP8 GEMMs: no layout to state
    peak = _physical(where, c, "fp8_peak_tflops")
    if c.get("fp8_gemm_ceiling") is None:
        raise UserError(
            f"{where}: fp8_peak_tflops={c['fp8_peak_tflops']} needs fp8_gemm_ceiling (the "
            "fraction of it the best FP8 GEMMs reach in a published micro-benchmark)"
        )
    ceiling = _number(
        where, "fp8_gemm_ceiling", c["fp8_gemm_ceiling"], lambda v: 0 < v <= 1, "must be in (0, 1]"
    )
    overhead_us = c.get("fp8_kernel_overhead_us")
    if overhead_us is not None:
        overhead_us = _number(
            where, "fp8_kernel_overhead_us", overhead_us, lambda v: v >= 0, "must be >= 0"
        )
    return {
        "fp8_peak_flops_per_s": units.tflops_to_flops_per_s(peak),
        "fp8_gemm_ceiling": ceiling,
        "fp8_kernel_overhead_s": None if overhead_us is None else units.us_to_s(overhead_us),
        "mxfp8": bool(c.get("mxfp8", False)),
        "fp8_any_layout": bool(c.get("fp8_any_layout", False)),
    }


def _physical(where: str, c: dict, key: str) -> float:
    """A device figure that must be positive and inside :data:`PHYSICAL_RANGES`."""
    value = _number(where, key, c.get(key), lambda v: v > 0, "must be > 0")
    low, high, unit, why = PHYSICAL_RANGES[key]
    _require(
        where,
        key,
        c.get(key),  # as typed
        low <= value <= high,
        f"is outside the physical range {low:,g}-{high:,g} {unit} ({why}); check the unit",
    )
    return value


def _reserve_bytes(where: str, c: dict, hbm: float) -> tuple[float, float]:
    """The memory a device keeps from the model: ``memory_reserve_gib`` plus ``memory_margin``
    of the HBM, checked to leave some of it; and the margin's part of it, bytes."""
    capacity_gib = hbm / units.GiB
    reserve = _number(
        where,
        "memory_reserve_gib",
        c.get("memory_reserve_gib", 0.0),
        lambda v: 0 <= v < capacity_gib,
        f"must be >= 0 and below the HBM ({capacity_gib:g} GiB)",
    )
    margin = _number(
        where,
        "memory_margin",
        c.get("memory_margin", 0.0),
        lambda v: 0 <= v < 1,
        "must be in [0, 1)",
    )
    reserve_bytes = units.gib_to_bytes(reserve) + margin * hbm
    _require(
        where,
        "memory_reserve_gib + memory_margin",
        f"{reserve} GiB + {margin}",
        reserve_bytes < hbm,
        "must leave some of the HBM to the model",
    )
    return reserve_bytes, margin * hbm


PHYSICAL_RANGES = {
    # key: (low, high, unit, why); generous on both sides of every accelerator sold, so that a
    # figure outside is a unit mistake (TB for GB, FLOP/s for TFLOP/s), never a real device
    "peak_tflops": (
        1,
        100_000,
        "TFLOP/s",
        "dense 16-bit peaks run from ~125 (V100) to ~2,250 (B200)",
    ),
    "fp8_peak_tflops": (
        1,
        100_000,
        "TFLOP/s",
        "dense FP8 peaks run from ~1,979 (H100) to ~5,000 (B300)",
    ),
    "hbm_gb": (1, 1024, "GB", "device memories run from 16 GB to 288 GB"),
    "hbm_gib": (1, 1024, "GiB", "device memories run from 16 GB to 288 GB"),
    "hbm_bw_gbps": (10, 100_000, "GB/s", "HBM runs from ~900 GB/s (V100) to ~8,000 (B200)"),
    "host_link_gbps": (
        1,
        10_000,
        "GB/s per direction",
        "host links run from PCIe Gen3 x16 (16 GB/s) to NVLink-C2C (450 GB/s)",
    ),
    "bw_gbps": (
        0.01,
        100_000,
        "GB/s per device",
        "links run from 1 Gb Ethernet (0.125 GB/s) to NVLink 5 (900 GB/s per direction)",
    ),
}
"""Physical ranges of a device's figures (:func:`build_device` refuses a value outside)."""


def _compute_model(c: dict, peak_tflops: float) -> tuple[str, tuple[str, ...]]:
    """The compute model a device uses, and a notice when it cannot use the one it names:
    ``shape`` needs kernel figures published for this chip (``kernel_figures_peak_tflops``
    equal to its ``peak_tflops``); a device given by overrides over another chip's preset
    would otherwise run on that chip's GEMM ceiling, kernel overhead and attention table."""
    model = str(c.get("compute_model", "flat"))
    figures_for = c.get("kernel_figures_peak_tflops")
    if model != "shape" or figures_for is None or math.isclose(figures_for, peak_tflops):
        return model, ()
    return "flat", (
        f"device {c.get('name')}: peak_tflops={peak_tflops:g} is not the chip its kernel figures "
        f"(gemm_ceiling, kernel_overhead_us, attention tables) were published for "
        f"({figures_for:g} TFLOP/s): using compute_model=flat (every FLOP at peak x "
        "matmul_efficiency); give the chip's own figures and kernel_figures_peak_tflops to use "
        "compute_model=shape",
    )


def _attention_table(where: str, name: str, rows) -> tuple[tuple[float, float], ...]:
    """``[[length, fraction], ...]`` from a preset as a tuple of float pairs."""
    try:
        return tuple((float(length), float(frac)) for length, frac in rows)
    except (TypeError, ValueError):
        raise UserError(
            f"{where}: {name}={rows!r} must be [[sequence length, fraction], ...]"
        ) from None


def build_cluster(cfg: Any) -> Cluster:
    c = _plain(cfg)
    name = c.get("name", "cluster")
    if c.get("graph_path") or c.get("topology"):
        from nest.graph import refuse_in_network

        refuse_in_network(c)
    if c.get("graph_path") or (c.get("topology") and c.get("topology") != "hierarchy"):
        from nest.graph import build_graph_cluster

        devices = c.get("devices")
        if isinstance(devices, int) and not isinstance(devices, bool):
            _within_limit("cluster.devices", devices, "devices")  # before a generator builds it
        cluster = build_graph_cluster(c, build_device(c["device"]))
        _within_limit("cluster.devices", cluster.num_devices, "devices")  # a file or a table
        return cluster
    levels_cfg = c.get("levels") or []
    if not levels_cfg:
        raise UserError(f"cluster {name}: give at least one level under cluster.levels")
    if not 1 <= len(levels_cfg) <= 8:
        raise UserError(f"cluster {name}: {len(levels_cfg)} levels; use 1 to 8")
    fanouts = _fanouts(name, levels_cfg, c.get("devices"))
    switched_on = _in_network_on(name, c, levels_cfg)
    levels = [_level(i, lv, fanouts[i], switched_on) for i, lv in enumerate(levels_cfg)]
    cluster = Cluster(name=name, device=build_device(c["device"]), levels=tuple(levels))
    if c.get("topology") == "hierarchy":  # the same hierarchy, priced as a graph
        from nest.graph import build_graph_cluster

        return build_graph_cluster(c, cluster.device, hierarchy=cluster)
    return cluster


def _fanouts(name: str, levels_cfg: list, devices) -> list[int]:
    """The levels' fan-outs, the top one filled in from ``devices`` when it is null."""
    fanouts = [lv.get("fanout") for lv in levels_cfg]
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
        if devices < inner:
            return _inside_one_unit(fanouts[:-1], devices)
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
    _within_limit("cluster.devices", prod(fanouts), "devices")
    return fanouts


def _inside_one_unit(inner: list[int], devices: int) -> list[int]:
    """The fan-outs of an allocation smaller than one unit of the inner levels (``devices <
    prod(inner)``: 64 GPUs of a SuperPOD whose leaves hold 32 nodes of 8), placed as a
    topology-aware scheduler places a job: whole units from the bottom level up (8 GPUs to a
    node, then nodes under one leaf), the level where the count runs out partly filled, every
    level above it of fan-out 1 (a level with one member costs nothing:
    :mod:`nest.cost.collectives`). A count that fills no whole number of a lower level's units
    (12 GPUs on nodes of 8) is one line naming the value."""
    fanouts, left = [], devices
    for i, f in enumerate(inner):
        if left >= f and left % f:
            unit = prod(inner[: i + 1])
            fits = f"at most {unit}, " if i == 0 else ""
            raise UserError(
                f"cluster.devices={devices} is less than one unit of the inner fan-outs {inner} "
                f"(product {prod(inner)}) and not a multiple of {unit} (one unit of "
                f"{inner[: i + 1]}); use {fits}a multiple of {unit} below {prod(inner)}, or a "
                f"multiple of {prod(inner)}"
            )
        fanouts.append(min(f, left))
        left //= fanouts[-1]
    return [*fanouts, 1]


IN_NETWORK_OPTIONS = {"nvls": "NVLink SHARP", "sharp": "InfiniBand SHARP"}
"""The cluster options that turn a level's in-network all-reduce on (:attr:`Level.in_network`)."""


def _in_network_on(name: str, c: dict, levels_cfg: list) -> set[str]:
    """The in-network reductions the cluster turns on (``cluster.nvls``, ``cluster.sharp``),
    each offered by some level (else a one-line error naming the option)."""
    on = set()
    for option, what in IN_NETWORK_OPTIONS.items():
        value = c.get(option, False)
        if not isinstance(value, bool):
            raise UserError(f"cluster.{option}={value!r} must be true or false")
        if not value:
            continue
        if not any(lv.get("in_network") == option for lv in levels_cfg):
            raise UserError(
                f"cluster.{option}=true but no level of cluster {name} offers {what} "
                f"(in_network: {option} with in_network_gbps); set cluster.{option}=false"
            )
        on.add(option)
    return on


def _level(i: int, lv: dict, fanout: int, switched_on: set[str] = frozenset()) -> Level:
    """Level ``i`` of a preset, in SI units, its values checked; its in-network reduction kept
    where ``switched_on`` names it."""
    where = f"cluster.levels[{i}] ({lv.get('name')})"
    bw = _number(where, "bw_gbps", lv.get("bw_gbps"), lambda v: v > 0, "must be > 0")
    low, high, unit, why = PHYSICAL_RANGES["bw_gbps"]
    _require(
        where,
        "bw_gbps",
        lv.get("bw_gbps"),  # as typed
        low <= bw <= high,
        f"is outside the physical range {low:,g}-{high:,g} {unit} ({why}); check the unit",
    )
    lat = _number(where, "latency_us", lv.get("latency_us", 0.0), lambda v: v >= 0, "must be >= 0")
    over = _number(
        where,
        "oversubscription",
        lv.get("oversubscription", 1.0),
        lambda v: v >= 1,
        "must be >= 1",
    )
    bw_eff = _number(
        where,
        "bw_efficiency",
        lv.get("bw_efficiency", 1.0),
        lambda v: 0 < v <= 1,
        "must be in (0, 1]",
    )
    kind, in_gbps = lv.get("in_network"), lv.get("in_network_gbps")
    if kind is not None and kind not in IN_NETWORK_OPTIONS:
        raise UserError(
            f"{where}: in_network={kind!r}; use one of {list(IN_NETWORK_OPTIONS)} or leave it unset"
        )
    if (kind is None) != (in_gbps is None):
        raise UserError(
            f"{where}: in_network={kind!r} and in_network_gbps={in_gbps!r}; give both or neither"
        )
    if kind is not None:
        in_gbps = _number(where, "in_network_gbps", in_gbps, lambda v: v > 0, "must be > 0")
    on = kind in switched_on
    return Level(
        name=lv.get("name", f"level{i}"),
        fanout=fanout,
        bw_bytes_per_s=units.gbps_to_bytes_per_s(bw),
        latency_s=units.us_to_s(lat),
        oversubscription=over,
        bw_efficiency=bw_eff,
        in_network=kind if on else None,
        in_network_bw_bytes_per_s=units.gbps_to_bytes_per_s(in_gbps) if on else 0.0,
    )


def build_model_spec(cfg: Any) -> ModelSpec:
    """The :class:`ModelSpec` of a model section; a preset missing a required field (an empty
    file, one without ``defaults: [model_schema]``) is one line naming the fields."""
    c = _plain(cfg)
    required = [
        f.name
        for f in dataclasses.fields(ModelSpec)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    missing = [k for k in required if c.get(k) is None]
    if missing:
        name = f"model {c['name']!r}" if c.get("name") else "the model preset"
        raise UserError(
            f"{name} sets no {', '.join(missing)}; a model preset needs "
            f"{', '.join(required)} (copy conf/model/tiny.yaml, keeping defaults: [model_schema])"
        )
    return ModelSpec(**c)


def _spec_within_limits(spec) -> None:
    """A model's size against :data:`LIMITS`, before anything is built per block."""
    _within_limit("model.layers", spec.layers, "transformer blocks")
    _within_limit("model.num_experts", spec.num_experts, "experts")


def build_model(cfg: Any, training: Training):
    """The model a problem uses: a preset spec, a Hugging Face config, or a measured profile."""
    c = _plain(cfg)
    source = c.pop("source", "spec")
    if source == "hf":
        from nest.app.hf import load_hf_model

        hf = load_hf_model(c.get("config_path"), name=c.get("name"), seq_len=c.get("seq_len"))
        _spec_within_limits(hf.spec)
        return AnalyticModel(
            hf.spec,
            flash_attention=training.flash_attention,
            fused_loss=training.fused_loss,
            cross_entropy_loss_fusion=training.cross_entropy_loss_fusion,
            overlap=training.overlap,
            precision=training.numerics,
            moe_routing=training.moe_routing,
            moe_dispatcher=training.moe_dispatcher,
            seq_len_source=hf.seq_len_source,
            notes=tuple(hf.notes),
        )
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
        _spec_within_limits(model.spec)
        if c.get("seq_len") and model.seq_len:
            model.seq_len_source = "model.seq_len"  # the config's, over the file's
        return model
    spec = build_model_spec(c)
    _spec_within_limits(spec)
    return AnalyticModel(
        spec,
        flash_attention=training.flash_attention,
        fused_loss=training.fused_loss,
        cross_entropy_loss_fusion=training.cross_entropy_loss_fusion,
        overlap=training.overlap,
        precision=training.numerics,
        moe_routing=training.moe_routing,
        moe_dispatcher=training.moe_dispatcher,
    )


def build_training(cfg: Any) -> Training:
    c = _plain(cfg)
    try:
        optimizer = Optimizer(c.get("optimizer", TRAINING_DEFAULTS["optimizer"]))
    except ValueError:
        raise UserError(
            f"training.optimizer={c.get('optimizer')!r}; use one of {[o.value for o in Optimizer]}"
        ) from None
    sizes = c.get("microbatch_sizes", [1])
    if isinstance(sizes, int):
        sizes = [sizes]
    if isinstance(c.get("global_batch"), int):
        _within_limit("training.global_batch", c["global_batch"], "sequences")
    flags = (
        "overlap_grad_sync",
        "sequence_parallel",
        "flash_attention",
        "fused_loss",
        "cross_entropy_loss_fusion",
        "tp_comm_overlap",
        "cp_comm_overlap",
        "ep_comm_overlap",
        "reshard_after_forward",
        "fp8_param_gather",
    )
    return Training(
        global_batch=c["global_batch"],
        microbatch_sizes=tuple(sorted(set(sizes))),
        optimizer=optimizer,
        grad_bytes=c.get("grad_bytes", TRAINING_DEFAULTS["grad_bytes"]),
        precision=str(c.get("precision", TRAINING_DEFAULTS["precision"])),
        fp8_recipe=str(c.get("fp8_recipe", TRAINING_DEFAULTS["fp8_recipe"])),
        zero3_prefetch_params=_prefetch_params(c.get("zero3_prefetch_params")),
        zero3_runtime=str(c.get("zero3_runtime", TRAINING_DEFAULTS["zero3_runtime"])),
        moe_routing=str(c.get("moe_routing", TRAINING_DEFAULTS["moe_routing"])),
        moe_dispatcher=str(c.get("moe_dispatcher", TRAINING_DEFAULTS["moe_dispatcher"])),
        cpu_adam_params_per_s=_number(
            "training",
            "cpu_adam_params_per_s",
            c.get("cpu_adam_params_per_s", TRAINING_DEFAULTS["cpu_adam_params_per_s"]),
            lambda v: v > 0,
            "must be positive: parameters the host CPU updates per second per device (e.g. 4.86e8)",
        ),
        **{key: bool(c.get(key, TRAINING_DEFAULTS[key])) for key in flags},
    )


def _prefetch_params(value: Any) -> int | None:
    """``training.zero3_prefetch_params``: null, or parameter elements (``5e7`` is accepted)."""
    if value is None:
        return None
    try:
        count = float(value)
    except (TypeError, ValueError):
        count = float("nan")
    if not count.is_integer() or count < 1:
        raise UserError(
            f"training.zero3_prefetch_params={value!r} must be a positive whole number of "
            "parameter elements (DeepSpeed's default 5e7) or null for a whole layer (FSDP2)"
        )
    return int(count)


def build_problem(cfg: Any) -> Problem:
    """Problem from a composed config with ``cluster``, ``model`` and ``training`` sections."""
    training = build_training(cfg["training"])
    return Problem(
        model=build_model(cfg["model"], training),
        cluster=build_cluster(cfg["cluster"]),
        training=training,
    )
