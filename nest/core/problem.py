"""The problem a planner solves: a model, a cluster and the training settings."""

from dataclasses import dataclass
from typing import Protocol

from nest.core.axes import Optimizer
from nest.core.errors import UserError
from nest.core.hardware import Device
from nest.core.layers import LayerCost, Overlap, Shard
from nest.core.model import LayerRef
from nest.core.precision import Fp8Recipe, Precision
from nest.core.topology import Cluster


class ModelFacts(Protocol):
    """What planners read from ``model.spec`` (a :class:`nest.core.model.ModelSpec` or a profile's
    :class:`nest.profile.model.ProfileSpec`)."""

    name: str
    layers: int
    """Transformer blocks in the chain."""
    seq_len: int
    dtype_bytes: int
    num_experts: int
    is_moe: bool


class LayerModel(Protocol):
    """A model as the cost model and the planners see it: a chain of layers and each layer's
    cost on one device for one shard. :class:`nest.core.layers.AnalyticModel` (published formulas)
    and :class:`nest.profile.model.ProfileModel` (measurements) both satisfy it."""

    spec: ModelFacts
    chain: tuple[LayerRef, ...]
    """Embedding, transformer blocks, head."""
    notes: tuple[str, ...]
    """Remarks the run summary prints (e.g. how a profile was converted); ``()`` by default."""
    seq_len_source: str
    """The rule that gave the training length, printed in the summary and written to
    report.json: ``"model.seq_len"`` (given) by default, else e.g. a Hugging Face config's field
    (nest/app/hf.py), ``"the profile file"`` or ``"not given"``."""

    @property
    def name(self) -> str: ...

    @property
    def seq_len(self) -> int: ...

    def layer_cost(self, ref: LayerRef, shard: Shard, device: Device) -> LayerCost: ...

    def cost_key(self, ref: LayerRef) -> tuple:
        """Layers with equal keys cost the same under every shard."""
        ...

    def shard_problem(self, shard: Shard) -> str | None:
        """Why the model cannot be split this way (None if it can)."""
        ...

    def shard_rules(self) -> list[str]:
        """The rules :meth:`shard_problem` applies, in words (for the empty-space error)."""
        ...

    def total_params(self) -> float: ...

    def model_flops_per_sample(self) -> float: ...


OPTIMIZER_STATE_BYTES_PER_PARAM = {
    # Adam, mixed precision: fp32 master weights, first and second moments (Rajbhandari et al.,
    # "ZeRO", SC20, §3.1: K = 12).
    Optimizer.ADAM: 12,
    # Plain SGD without momentum keeps no state (the NEST artifact's setting,
    # docs/nest_paper.md §4.5).
    Optimizer.SGD: 0,
}

CPU_ADAM_HOST_PARAMS_PER_S = 10e9 / 2.57
"""Parameters per second one host's CPU-Adam updates: 10B parameters in 2.57 s (Ren et al.,
"ZeRO-Offload: Democratizing Billion-Scale Model Training", USENIX ATC 2021, the CPU-Adam
latency table: 0.22 s for 1B, 1.03 s for 4B, 2.57 s for 10B parameters on a DGX-2 host's CPUs;
the largest size, where the step is at its steady rate)."""

DEVICES_PER_HOST = 8
"""Devices sharing one host's CPUs: an HGX / DGX node's 8 GPUs, each process binding its share
of the cores (DeepSpeed ``--bind_cores_to_rank``). ASSUMED: the paper's latency used the whole
host, so each device's offloaded step runs at 1/8 of it."""


MOE_ROUTINGS = ("dropless", "balanced")
"""The values of :attr:`Training.moe_routing`."""

MOE_DISPATCHERS = ("alltoall", "deepep")
"""The values of :attr:`Training.moe_dispatcher`."""

ZERO3_RUNTIMES = ("prefetch", "synchronous")
"""The values of :attr:`Training.zero3_runtime`."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Training:
    """Training settings of one iteration. The defaults here are the only ones: the config
    schema (:class:`nest.app.config.TrainingConfig`) and ``conf/training/default.yaml`` take
    them from this class."""

    global_batch: int
    """Sequences per iteration (all replicas together)."""
    microbatch_sizes: tuple[int, ...] = (1,)
    """Candidate microbatch sizes (sequences) a planner may choose from."""
    optimizer: Optimizer = Optimizer.ADAM
    """``adam`` (16 bytes per parameter with bf16 gradients) or ``sgd`` (no state, as the NEST
    artifact)."""
    grad_bytes: int = 2
    """Bytes per gradient element (2: bf16 gradients as in ZeRO's 16 bytes/param; 4: fp32)."""
    overlap_grad_sync: bool = True
    """DP gradient synchronisation of a stage may overlap its last backward pass (Megatron-Core
    ``--overlap-grad-reduce``), and ZeRO-1/2's all-gather of the updated weights the next
    iteration's first forward (``--overlap-param-gather``)."""
    sequence_parallel: bool = True
    """Use sequence parallelism whenever tp > 1 (Korthikanti et al.)."""
    flash_attention: bool = True
    """Fused attention that keeps no ``s x s`` scores (Dao et al. 2022); False reproduces the
    activation inventory of Korthikanti et al. 2022."""
    fused_loss: bool = True
    """The loss is a fused vocabulary-parallel cross entropy that keeps the fp32 softmax and
    writes its gradient in place (Megatron-Core ``vocab_parallel_cross_entropy``): 6 bytes per
    logit at the head's peak. False: PyTorch's ``F.cross_entropy`` on the fp32-cast logits
    (torchtitan), 12 bytes per logit (:meth:`nest.core.layers.AnalyticModel._head_cost`)."""
    cross_entropy_loss_fusion: bool = True
    """With ``fused_loss`` (Megatron-Core's vocabulary-parallel cross entropy): Megatron-LM's
    ``--cross-entropy-loss-fusion``, the forward's cast, max, subtract and exponential fused into
    fewer passes over the logits (``megatron/core/fusions/fused_cross_entropy.py``). False: the
    unfused ``megatron/core/tensor_parallel/cross_entropy.py``, Megatron-LM's default (the flag
    is ``store_true``, ``megatron/training/arguments.py`` at 1e057005), 12 more bytes per logit
    in six forward kernels (:data:`nest.core.layers.UNFUSED_MEGATRON_LOSS_STREAM`). Ignored
    without ``fused_loss``."""
    tp_comm_overlap: bool = True
    """TP all-gathers / reduce-scatters under their GEMMs: Megatron-Core's
    ``--tp-comm-overlap`` (:class:`nest.core.layers.Overlap`; needs sequence parallelism)."""
    cp_comm_overlap: bool = True
    """Context parallelism's K/V ring exchange under the attention (Transformer Engine
    ``cp_comm_type=p2p``)."""
    ep_comm_overlap: bool = False
    """MoE all-to-all under another microbatch's compute: Megatron-Core's
    ``--overlap-moe-expert-parallel-comm``."""
    reshard_after_forward: bool = True
    """ZeRO-3: free the gathered weights after each layer's forward and gather them again for
    its backward (FSDP2 ``reshard_after_forward=True``, its default; DeepSpeed ZeRO-3). False
    keeps the stage's gathered weights from the forward to the backward (FSDP2 ``False``,
    torchtitan ``fsdp_reshard_after_forward = "never"``): no backward gather, the stage's whole
    weights in memory (:mod:`nest.cost.fsdp`)."""
    zero3_prefetch_params: int | None = None
    """ZeRO-3: parameter elements a rank fetches ahead of use. None (the default): a whole layer,
    as FSDP2 prefetches a unit; DeepSpeed ZeRO-3 fetches at most ``stage3_prefetch_bucket_size``
    (default ``5e7``), less than a large model's layer (:mod:`nest.cost.fsdp`)."""
    zero3_runtime: str = "prefetch"
    """ZeRO-3: how the runtime orders its collectives with compute (:mod:`nest.cost.fsdp`).
    ``prefetch`` (the default): gathers and reduce-scatters on their own stream under the
    neighbouring layers' compute, as FSDP2 and DeepSpeed from v0.6.0 run them. ``synchronous``:
    DeepSpeed ZeRO-3 v0.3.13 to v0.5.x (2021), which calls ``torch.cuda.synchronize()`` before
    every parameter's all-gather and after every fetch, so no collective runs under compute and
    every gather and reduce-scatter is charged in full."""
    moe_routing: str = "dropless"
    """How a MoE router's tokens reach the experts: ``dropless`` (every token goes to the experts
    it chose, so each step waits for the most loaded expert rank:
    :func:`nest.core.layers.dropless_load_factor` of the expert-parallel degree and the local
    experts) or ``balanced`` (every expert rank gets the
    mean share: Megatron-Core's ``--moe-router-force-load-balancing`` of the published
    benchmarks, or a capacity factor that pads every expert to the same load)."""
    moe_dispatcher: str = "alltoall"
    """How a MoE block's tokens travel to their experts' ranks and back: ``alltoall`` (one copy
    per chosen expert, Megatron-Core's ``--moe-token-dispatcher-type alltoall``) or ``deepep``
    (DeepEP's dispatch and combine, ``--moe-token-dispatcher-type flex
    --moe-flex-dispatcher-backend deepep``: one network copy per remote NVLink domain, forwarded
    inside it over NVLink; :mod:`nest.core.alphabeta`). Needs a cluster given by levels."""
    precision: str = "bf16"
    """``bf16``, or ``fp8``: the transformer blocks' GEMMs in FP8 (:mod:`nest.core.precision`)."""
    fp8_recipe: str = "delayed"
    """FP8 scaling: ``delayed``, ``tensorwise`` (current), ``blockwise`` or ``mxfp8``
    (Megatron-LM ``--fp8-recipe``)."""
    fp8_param_gather: bool = False
    """FP8 primary weights, all-gathered in FP8 (Megatron-LM ``--fp8-param-gather``)."""
    cpu_adam_params_per_s: float = CPU_ADAM_HOST_PARAMS_PER_S / DEVICES_PER_HOST
    """Parameters per second the host CPU updates for one device whose optimizer is offloaded
    (:attr:`nest.core.plan.ParallelConfig.optimizer_offload`): ZeRO-Offload's CPU-Adam rate
    (:data:`CPU_ADAM_HOST_PARAMS_PER_S`, 3.89e9) shared by :data:`DEVICES_PER_HOST` devices,
    4.86e8. Used only by plans that offload."""

    @property
    def numerics(self) -> Precision:
        """The precision options as one value (:class:`nest.core.precision.Precision`)."""
        return Precision.parse(self.precision, self.fp8_recipe, self.fp8_param_gather)

    @property
    def overlap(self) -> Overlap:
        """The overlap features the layer model applies."""
        return Overlap(tp=self.tp_comm_overlap, cp=self.cp_comm_overlap, ep=self.ep_comm_overlap)

    def __post_init__(self) -> None:
        if not isinstance(self.global_batch, int) or self.global_batch < 1:
            raise UserError(
                f"training.global_batch={self.global_batch!r} must be a positive integer"
            )
        if not self.microbatch_sizes or any(
            not isinstance(b, int) or b < 1 for b in self.microbatch_sizes
        ):
            raise UserError(
                f"training.microbatch_sizes={list(self.microbatch_sizes)} must be positive integers"
            )
        prefetch = self.zero3_prefetch_params
        if prefetch is not None and (not isinstance(prefetch, int) or prefetch < 1):
            raise UserError(
                f"training.zero3_prefetch_params={prefetch!r} must be a positive integer "
                "(parameter elements) or null for a whole layer (FSDP2)"
            )
        if self.zero3_runtime not in ZERO3_RUNTIMES:
            raise UserError(
                f"training.zero3_runtime={self.zero3_runtime!r}; use one of {list(ZERO3_RUNTIMES)}"
            )
        for b in self.microbatch_sizes:
            if self.global_batch % b:
                raise UserError(
                    f"training.global_batch={self.global_batch} is not divisible by microbatch "
                    f"size {b}; pick microbatch sizes that divide it"
                )
        if self.grad_bytes not in (2, 4):
            raise UserError(f"training.grad_bytes={self.grad_bytes}; use 2 (bf16) or 4 (fp32)")
        if not self.cpu_adam_params_per_s > 0:
            raise UserError(
                f"training.cpu_adam_params_per_s={self.cpu_adam_params_per_s!r} must be > 0 "
                "(parameters the host CPU updates per second for one device)"
            )
        if self.moe_routing not in MOE_ROUTINGS:
            raise UserError(
                f"training.moe_routing={self.moe_routing!r}; use one of {list(MOE_ROUTINGS)}"
            )
        if self.moe_dispatcher not in MOE_DISPATCHERS:
            raise UserError(
                f"training.moe_dispatcher={self.moe_dispatcher!r}; use one of "
                f"{list(MOE_DISPATCHERS)}"
            )
        self.numerics  # noqa: B018 (refuses an unknown precision or recipe, in one line)

    @property
    def optimizer_state_bytes_per_param(self) -> int:
        return OPTIMIZER_STATE_BYTES_PER_PARAM[self.optimizer]


@dataclass(frozen=True, slots=True, kw_only=True)
class Problem:
    model: LayerModel
    cluster: Cluster
    training: Training

    def __post_init__(self) -> None:
        numerics = self.training.numerics
        device = self.cluster.device
        if numerics.fp8 and not device.has_fp8:
            raise UserError(
                f"training.precision=fp8 but device {device.name} has no FP8 tensor cores (its "
                "preset sets no fp8_peak_tflops); use training.precision=bf16 or an FP8 device "
                "(h100_sxm, h200_sxm)"
            )
        if numerics.fp8 and numerics.recipe is Fp8Recipe.MXFP8 and not device.mxfp8:
            raise UserError(
                f"training.fp8_recipe=mxfp8 needs Blackwell tensor cores; device {device.name} "
                "has none: use fp8_recipe=delayed, tensorwise or blockwise"
            )
        if self.training.moe_dispatcher == "deepep" and not self.cluster.fabric.offers_deepep:
            raise UserError(
                "training.moe_dispatcher=deepep on a cluster given as a graph: DeepEP's per-domain "
                "forwarding is priced on clusters given by levels; use training.moe_dispatcher="
                "alltoall or a cluster with levels"
            )
        model_dispatcher = getattr(self.model, "moe_dispatcher", None)
        if model_dispatcher is not None and model_dispatcher != self.training.moe_dispatcher:
            raise UserError(
                f"the model was built for moe_dispatcher={model_dispatcher} but training."
                f"moe_dispatcher={self.training.moe_dispatcher}; build it with the training "
                "options (nest.app.config.build_model)"
            )
        for flag in ("fused_loss", "cross_entropy_loss_fusion"):
            built = getattr(self.model, flag, None)
            if built is not None and built != getattr(self.training, flag):
                raise UserError(
                    f"the model was built with {flag}={built} but training.{flag}="
                    f"{getattr(self.training, flag)}; build it with the training options "
                    "(nest.app.config.build_model)"
                )
        model_precision = getattr(self.model, "precision", None)
        if model_precision is not None and model_precision != numerics:
            raise UserError(
                f"the model was built for {model_precision.format} GEMMs but training.precision="
                f"{self.training.precision}; build it with the training options "
                "(nest.app.config.build_model)"
            )

    @property
    def num_layers(self) -> int:
        """Length of the layer chain (embedding + blocks + head)."""
        return len(self.model.chain)
