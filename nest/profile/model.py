"""``ProfileModel``: a measured profile behind the interface of
:class:`nest.core.layers.AnalyticModel`.

The evaluator, the NEST DP and the baselines call ``chain``, ``layer_cost(ref, shard, device)``,
``shard_problem(shard)``, ``total_params()``, ``model_flops_per_sample()``, ``seq_len``, ``name``
and ``spec`` (``layers``, ``heads``, ``num_experts``, ``is_moe``, ``dtype_bytes``); this class
answers them from measurements. The semantics:

- **Widths.** A measurement gives per-device values at one (tp, cp, ep) width. A shard is valid
  iff its (tp, cp, ep) was measured: the planners search only measured widths. Sequence
  parallelism is whatever the measurement ran with; ``training.sequence_parallel`` changes
  nothing in a profile's numbers (it is still exported as a flag).
- **Collectives.** ``tp_collectives: measured`` (the default, and the NEST artifact's meaning):
  the measured times already include the layer's TP, CP and EP collectives as they ran when
  profiled, so the layer issues none and their placement on the network is not seen by the
  planner. ``modelled``: the times are compute only and every block issues Megatron's tensor
  traffic, two all-reduces of its ``boundary_bytes`` in the forward pass and two in the backward
  pass (Shoeybi et al. 2019, "Megatron-LM", §3: the ``f`` and ``g`` operators); full recomputation
  repeats the forward ones. CP and EP traffic is always taken as measured (it depends on attention
  and routing internals a profile does not describe).
- **Computed by the shared evaluator**, never measured: pipeline p2p (``boundary_bytes`` over the
  level two stages share), DP gradient sync and ZeRO traffic (``param_bytes``), the optimizer step,
  and every memory term (weights, gradients and optimizer state from ``param_bytes``; activations
  x in-flight microbatches).
- **Recomputation.** none: ``act_none_bytes``. selective: ``act_selective_bytes`` and
  ``recompute_selective_s`` when both are given, otherwise selective equals none (no saving, no
  cost). full: ``act_full_bytes``, by default the layer's input (the previous layer's
  ``boundary_bytes``, at most ``act_none_bytes``; Korthikanti et al. 2022 §4.2: full recomputation
  keeps only each layer's input), and one more forward pass (``fwd_s``, its FLOPs ``fwd_flops``).
  mlp and selective_mlp: a profile does not measure the MLP's share, so ``mlp`` equals none and
  ``selective_mlp`` equals selective (no saving, no cost); nor the op-level share, so ``op``
  equals none, nor what JAX's dots and named policies, MLA's up-projections or the whole MLP
  keep, so ``dots``, ``qkv_proj``, ``qkv_out_proj``, ``mla_up_proj``, ``mlp_moe`` and
  ``mla_up_proj_mlp_moe`` equal none. ``nothing_saveable`` (JAX's remat with no saveable value)
  keeps the layer's input as ``full`` does and is charged ``full``'s rerun, an upper bound (a
  profile does not measure the FC2 share it skips).
- **Microbatch size.** The measurement at the requested microbatch size when there is one; else
  (``microbatch_scaling: linear``) the nearest measured one (largest below, else smallest above)
  scaled linearly (times, activations, boundary, transient and FLOPs x ``b / b0``; parameters
  unchanged): a pessimistic extrapolation for compute, exact for activation sizes. ``none``: an
  unmeasured microbatch size is an error.
- **MFU** needs ``fwd_flops`` on every layer; without them the model FLOPs are 0 (MFU not known).
- **Chain shape**: a profile without an embedding (head) layer gets a zero-cost one, so every
  chain is embedding, blocks, head as the analytic model's.
"""

from dataclasses import dataclass, replace
from math import lcm

from nest.core.axes import CollectiveOp, GroupKind, LayerKind, Recompute
from nest.core.errors import UserError
from nest.core.layers import Collective, LayerCost, Shard
from nest.core.model import LayerRef
from nest.profile.schema import LayerProfile, Measurement, Profile

SCALINGS = ("linear", "none")


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileSpec:
    """What planners read from ``model.spec``, for a profile."""

    name: str
    layers: int
    """Transformer blocks in the chain."""
    seq_len: int
    dtype_bytes: int
    num_experts: int
    """The least common multiple of the measured expert widths (planners enumerate its divisors)."""
    is_moe: bool
    heads: int | None = None
    """Unknown in a profile (tensor widths come from the measurements instead)."""


def _end(kind: LayerKind, boundary_bytes: float) -> LayerProfile:
    return LayerProfile(
        name=f"{kind} (none in profile)",
        kind=kind,
        fwd_s=0.0,
        bwd_s=0.0,
        param_bytes=0.0,
        act_none_bytes=0.0,
        boundary_bytes=boundary_bytes,
    )


def with_end_layers(profile: Profile) -> Profile:
    """The profile with zero-cost embedding / head layers where it has none, so that every chain
    is embedding, blocks, head (the baselines and the exporters count blocks that way). The added
    embedding sends the first block's input size (its ``boundary_bytes``); the head sends nothing.
    """
    measurements = []
    for m in profile.measurements:
        layers = list(m.layers)
        if layers[0].kind is not LayerKind.EMBEDDING:
            layers.insert(0, _end(LayerKind.EMBEDDING, layers[0].boundary_bytes))
        if layers[-1].kind is not LayerKind.HEAD:
            layers.append(_end(LayerKind.HEAD, 0.0))
        measurements.append(replace(m, layers=tuple(layers)))
    return replace(profile, measurements=tuple(measurements))


class ProfileModel:
    """Per-layer costs from a :class:`~nest.profile.schema.Profile` (see the module docstring)."""

    def __init__(self, profile: Profile, *, microbatch_scaling: str = "linear") -> None:
        if microbatch_scaling not in SCALINGS:
            raise UserError(
                f"model.microbatch_scaling={microbatch_scaling!r}; use {' or '.join(SCALINGS)}"
            )
        profile = with_end_layers(profile)
        self.profile = profile
        self.microbatch_scaling = microbatch_scaling
        first = profile.measurements[0]
        self.chain: tuple[LayerRef, ...] = tuple(
            LayerRef(
                index=i,
                kind=layer.kind,
                name=layer.name,
                moe=any(m.layers[i].expert_param_bytes > 0 for m in profile.measurements),
            )
            for i, layer in enumerate(first.layers)
        )
        eps = {m.ep for m in profile.measurements}
        self.spec = ProfileSpec(
            name=profile.name,
            layers=sum(ref.kind is LayerKind.BLOCK for ref in self.chain),
            seq_len=profile.seq_len or 0,
            dtype_bytes=profile.dtype_bytes,
            num_experts=lcm(*eps),
            is_moe=max(eps) > 1 or any(ref.moe for ref in self.chain),
        )
        self.widths = sorted({m.width for m in profile.measurements})
        self.notes = tuple(profile.notes)
        """Remarks the run summary prints (how the profile was converted)."""
        self.seq_len_source = "the profile file" if self.spec.seq_len else "not given"
        """Where ``spec.seq_len`` came from (``LayerModel.seq_len_source``)."""
        self._cache: dict = {}

    @property
    def name(self) -> str:
        return self.profile.name

    @property
    def seq_len(self) -> int:
        """Tokens per sequence; 0 when the profile does not say (tokens/s is then 0)."""
        return self.profile.seq_len or 0

    # ------------------------------------------------------------------ validity
    def shard_rules(self) -> list[str]:
        shown = ", ".join(f"(tp={t}, cp={c}, ep={e})" for t, c, e in self.widths)
        return [f"(tp, cp, ep) must be a measured width: {shown}"]

    def shard_problem(self, shard: Shard) -> str | None:
        if shard.etp is not None:
            return (
                f"profile {self.name} measured experts split like the dense weights; etp="
                f"{shard.etp} is not measured (solver.etp=[tp])"
            )
        if (shard.tp, shard.cp, shard.ep) in self.widths:
            return None
        shown = ", ".join(f"(tp={t}, cp={c}, ep={e})" for t, c, e in self.widths)
        return (
            f"profile {self.name} has no measurement at tp={shard.tp}, cp={shard.cp}, "
            f"ep={shard.ep}; it was measured at {shown}: restrict the degrees to those "
            "(e.g. solver.tp=[...]) or add the measurement"
        )

    def measurement(self, shard: Shard) -> tuple[Measurement, float]:
        """The measurement for a shard and the factor its per-microbatch values scale by."""
        reason = self.shard_problem(shard)
        if reason:
            raise UserError(reason)
        same = [m for m in self.profile.measurements if m.width == (shard.tp, shard.cp, shard.ep)]
        exact = [m for m in same if m.microbatch_size == shard.mbs]
        if exact:
            return exact[0], 1.0
        sizes = sorted(m.microbatch_size for m in same)
        if self.microbatch_scaling == "none":
            raise UserError(
                f"profile {self.name} was measured at microbatch sizes {sizes} for tp={shard.tp}, "
                f"cp={shard.cp}, ep={shard.ep}, not {shard.mbs}; set training.microbatch_sizes to "
                "those or model.microbatch_scaling=linear"
            )
        below = [b for b in sizes if b <= shard.mbs]
        b0 = below[-1] if below else sizes[0]
        return next(m for m in same if m.microbatch_size == b0), shard.mbs / b0

    # ------------------------------------------------------------------ totals
    def _base(self) -> Measurement:
        return min(self.profile.measurements, key=lambda m: (m.width, m.microbatch_size))

    def param_count(self, ref: LayerRef) -> float:
        """Parameters of a layer: per-device bytes of the narrowest measurement x its widths."""
        m = self._base()
        layer = m.layers[ref.index]
        dense = layer.param_bytes * m.tp
        expert = layer.expert_param_bytes * m.tp * m.ep
        return (dense + expert) / self.profile.dtype_bytes

    def total_params(self) -> float:
        return sum(self.param_count(ref) for ref in self.chain)

    def model_flops_per_sample(self) -> float:
        """3 x the forward FLOPs of one sequence (all devices of a width together); 0 if the
        profile has no FLOPs."""
        m = self._base()
        if any(layer.fwd_flops is None for layer in m.layers):
            return 0.0
        per_mb = sum(layer.fwd_flops for layer in m.layers) * m.tp * m.cp
        return 3.0 * per_mb / m.microbatch_size

    def cost_key(self, ref: LayerRef) -> tuple:
        """Layers with equal keys cost the same under every shard: the same kind and the same
        measured numbers in every measurement (names aside). Measured layers differ, so unlike
        the analytic model's, the position matters through the numbers."""
        return (
            ref.kind,
            tuple(replace(m.layers[ref.index], name="") for m in self.profile.measurements),
        )

    # ------------------------------------------------------------------ the cost
    def layer_cost(self, ref: LayerRef, shard: Shard, device=None) -> LayerCost:
        key = (ref.index, shard)
        cost = self._cache.get(key)
        if cost is None:
            cost = self._layer_cost(ref, shard)
            self._cache[key] = cost
        return cost

    def _layer_cost(self, ref: LayerRef, shard: Shard) -> LayerCost:
        m, k = self.measurement(shard)
        layer: LayerProfile = m.layers[ref.index]
        incoming = m.layers[ref.index - 1].boundary_bytes if ref.index > 0 else 0.0
        act_none = layer.act_none_bytes * k
        act_full = layer.act_full_bytes if layer.act_full_bytes is not None else incoming
        act_full = min(act_full * k, act_none)
        has_selective = (
            layer.act_selective_bytes is not None and layer.recompute_selective_s is not None
        )
        act_sel = layer.act_selective_bytes * k if has_selective else act_none
        sel_s = layer.recompute_selective_s * k if has_selective else 0.0
        fwd_s, flops = layer.fwd_s * k, (layer.fwd_flops or 0.0) * k
        fwd_coll: tuple[Collective, ...] = ()
        if (
            self.profile.tp_collectives == "modelled"
            and shard.tp > 1
            and ref.kind is LayerKind.BLOCK
        ):
            fwd_coll = (
                Collective(CollectiveOp.ALL_REDUCE, GroupKind.TP, layer.boundary_bytes * k),
            ) * 2
        p = self.profile.dtype_bytes
        return LayerCost(
            dense_params=layer.param_bytes / p,
            expert_params=layer.expert_param_bytes / p,
            tied_copy_params=layer.tied_copy_param_bytes / p,
            fwd_flops=flops,
            fwd_s=fwd_s,
            bwd_s=layer.bwd_s * k,
            wgrad_s=(layer.wgrad_s or 0.0) * k,
            recompute_s=_by_mode(0.0, sel_s, fwd_s),
            recompute_flops=_by_mode(0.0, 0.0, flops),
            act_bytes=_by_mode(act_none, act_sel, act_full),
            transient_bytes=layer.transient_bytes * k,
            boundary_bytes=layer.boundary_bytes * k,
            fwd_collectives=fwd_coll,
            bwd_collectives=fwd_coll,
            recompute_collectives=_by_mode((), (), fwd_coll),
        )


def _by_mode(none, selective, full) -> dict:
    """A profiled layer's value per recompute mode (module docstring): ``selective`` and
    ``selective_mlp`` take ``selective``'s, ``full`` and ``nothing_saveable`` ``full``'s, every
    other mode ``none``'s (a profile does not measure what they keep)."""
    out = {mode: none for mode in Recompute}
    out[Recompute.SELECTIVE] = out[Recompute.SELECTIVE_MLP] = selective
    out[Recompute.FULL] = out[Recompute.NOTHING_SAVEABLE] = full
    return out
