"""A profile written from any model with the per-layer interface (e.g. the analytic model).

Useful as a template of the schema (``data/profiles/``) and as the oracle of the profile model's
tests: a profile of the analytic model at tp = cp = ep = 1 must evaluate every plan exactly as the
analytic model does (no collectives exist at those widths).
"""

from nest.core.axes import Recompute
from nest.core.layers import Shard
from nest.profile.schema import LayerProfile, Measurement, Profile


def _layer(ref, cost, p: int) -> LayerProfile:
    """Extra backward work the model charges under every recompute mode (FlashAttention's score
    recomputation) is folded into ``bwd_s``: the stage totals are unchanged."""
    none_s = cost.recompute_s.get(Recompute.NONE, 0.0)
    sel_s = cost.recompute_s.get(Recompute.SELECTIVE)
    return LayerProfile(
        name=ref.name,
        kind=ref.kind,
        fwd_s=cost.fwd_s,
        bwd_s=cost.bwd_s + none_s,
        param_bytes=cost.dense_params * p,
        expert_param_bytes=cost.expert_params * p,
        tied_copy_param_bytes=cost.tied_copy_params * p,
        act_none_bytes=cost.act_bytes[Recompute.NONE],
        act_selective_bytes=cost.act_bytes[Recompute.SELECTIVE],
        act_full_bytes=cost.act_bytes[Recompute.FULL],
        recompute_selective_s=None if sel_s is None else sel_s - none_s,
        wgrad_s=cost.wgrad_s or None,
        boundary_bytes=cost.boundary_bytes,
        transient_bytes=cost.transient_bytes,
        fwd_flops=cost.fwd_flops,
    )


def profile_of(model, device, *, shards: list[Shard], name: str | None = None) -> Profile:
    """One measurement per shard, each listing the model's whole chain. The analytic model's
    times are compute only, so the profile says ``tp_collectives: modelled``."""
    p = model.spec.dtype_bytes
    return Profile(
        name=name or model.name,
        seq_len=model.seq_len,
        dtype_bytes=p,
        tp_collectives="modelled",
        measurements=tuple(
            Measurement(
                tp=s.tp,
                cp=s.cp,
                ep=s.ep,
                microbatch_size=s.mbs,
                layers=tuple(
                    _layer(ref, model.layer_cost(ref, s, device), p) for ref in model.chain
                ),
            )
            for s in shards
        ),
    )
