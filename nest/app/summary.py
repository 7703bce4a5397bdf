"""The readable summary a run prints: degrees, placement, per-stage table, throughput, memory."""

import numpy as np

from nest.core.plan import Plan
from nest.core.problem import Problem
from nest.core.report import Report
from nest.core.segment import segment_allocation
from nest.core.units import GiB
from nest.cost.mfu import causal_mfu, fp8_peak_mfu, plausibility_note
from nest.planner import memory_fix


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def _placement(problem: Problem, plan: Plan) -> list[str]:
    cluster = problem.cluster
    lines = []
    for r in range(plan.pp):
        ids = np.asarray(plan.stages[r].devices).ravel()
        lo, hi = int(ids.min()), int(ids.max())
        span = cluster.num_levels - 1
        for level in range(cluster.num_levels):
            size = cluster.block_size(level)
            if lo // size == hi // size and len(set((ids // size).tolist())) == 1:
                span = level
                break
        contiguous = hi - lo + 1 == ids.size
        where = f"devices {lo}-{hi}" if contiguous else f"{ids.size} devices in {lo}-{hi}"
        lines.append(f"  rank {r}: {where}, within one {cluster.levels[span].name} block")
    return lines


def seq_len_source(model) -> str:
    """The rule that gave the model's training length: set by :func:`nest.app.config.build_model`
    (a Hugging Face config's may be a default, nest/app/hf.py); a model built directly from a spec
    takes its ``seq_len`` as given."""
    return model.seq_len_source


def sequence_line(model) -> str:
    """The training length in use and where it came from."""
    source = seq_len_source(model)
    if not model.seq_len:
        return "sequence length not given (tokens/s n/a; set model.seq_len)"
    return f"sequence length {model.seq_len:,} tokens ({source})"


def _segment_note(plan: Plan) -> str:
    """Where the plan uses a power-of-two share of every scale-up domain (nest's segment view,
    :func:`nest.core.segment.segment_allocation`), as a Slurm --segment allocation gives."""
    where = segment_allocation(plan.search)
    return f" (segments: {where}, the rest idle; docs/plan/presets.md)" if where else ""


def format_summary(problem: Problem, plan: Plan, report: Report) -> str:
    cluster, model = problem.cluster, problem.model
    mode_w = max([9, *(len(str(st.recompute)) for st in report.stages)])  # the recomp column
    out = [
        f"{plan.solver or 'plan'}: {model.name} on {cluster.describe()}",
        sequence_line(model),
        f"status {plan.status}; solved in {plan.solve_time_s:.3f} s",
        (
            f"degrees tp={plan.tp} cp={plan.cp} ep={plan.ep} dp={plan.dp} pp={plan.pp}"
            f" | microbatch {plan.microbatch_size} x {plan.num_microbatches}"
            f" | ZeRO-{plan.zero_stage}"
            + (f" within groups of {plan.zero_shard} of dp (HSDP)" if plan.zero_shard else "")
            + (" | optimizer on host" if plan.optimizer_offload else "")
            + (" | activations on host" if plan.activation_offload else "")
            + (
                f" (first {plan.activation_offload_blocks} blocks)"
                if plan.activation_offload_blocks
                else ""
            )
            + f" | {plan.schedule}"
            + (f" v={plan.virtual_stages}" if plan.virtual_stages > 1 else "")
            + (" | sequence parallel" if plan.sequence_parallel else "")
        ),
        "rank order (innermost first): "
        + (",".join(str(a) for a in plan.rank_order) if plan.rank_order else "explicit"),
        f"devices used {report.devices_used}, idle {report.devices_idle}" + _segment_note(plan),
        "placement:",
        *_placement(problem, plan),
        "",
        f"{'stage':>5} {'layers':>9} {'recomp':>{mode_w}} {'fwd ms':>8} {'bwd ms':>8} "
        f"{'comm ms':>8} {'exposed':>8} {'p2p ms':>7} {'mem GiB':>8} {'of GiB':>7}",
    ]
    for s in report.stages:
        mem = report.ranks[s.pp_rank].memory
        p2p = s.p2p_fwd_s + s.p2p_bwd_s
        out.append(
            f"{s.index:>5} {f'{s.first_layer}-{s.last_layer}':>9} {s.recompute:>{mode_w}} "
            f"{_ms(s.fwd_s):>8} {_ms(s.bwd_s):>8} {_ms(s.comm_total_s - p2p):>8} "
            f"{_ms(s.comm_exposed_s - p2p):>8} {_ms(p2p):>7} {mem.total_bytes / GiB:>8.2f} "
            f"{mem.capacity_bytes / GiB:>7.2f}"
        )
    out += [
        "",
        f"iteration {report.iteration_time_s:.4f} s = pipeline {report.pipeline_time_s:.4f} s "
        f"(bubble {report.bubble_s:.4f}) + exposed DP sync {report.dp_sync_exposed_s:.4f} s + "
        f"optimizer {report.optimizer_s:.4f} s",
        f"throughput {report.throughput_samples_per_s:.2f} samples/s, "
        + (f"{report.tokens_per_s:,.0f} tokens/s" if model.seq_len else "tokens/s n/a (no seq_len)")
        + _mfu_text(problem, report),
        f"peak memory {report.peak_memory_bytes / GiB:.2f} GiB of "
        f"{cluster.device.hbm_bytes / GiB:.2f} GiB"
        + ("" if report.feasible else f"  ** {report.violation}"),
        "",
        *memory_table(report),
    ]
    fix = memory_fix(problem, plan, report)
    if fix:
        out.append(fix)
    return "\n".join(out)


MEMORY_COLUMNS = (
    ("weights", "weights"),
    ("fp8_copies", "fp8"),
    ("gradients", "grads"),
    ("optimizer_state", "optim"),
    ("activations", "activ"),
    ("comm_buffers", "comm"),
    ("transient", "transnt"),
    ("reserve", "reserve"),
)
"""The summary's memory columns: :meth:`nest.core.report.MemoryReport.terms` keys, headers."""


def memory_table(report: Report) -> list[str]:
    """Per pipeline rank, the memory terms of one of its devices (GiB), which sum to its total,
    and the activations per in-flight microbatch times the microbatches in flight."""
    out = [
        "memory per device (GiB): "
        + "terms sum to the total; activations = per microbatch x microbatches in flight",
        f"{'rank':>4} "
        + " ".join(f"{h:>7}" for _, h in MEMORY_COLUMNS)
        + f" {'total':>7} {'of':>7}  activations",
    ]
    for rank in report.ranks:
        m = rank.memory
        terms = m.terms()
        out.append(
            f"{rank.pp_rank:>4} "
            + " ".join(f"{terms[k] / GiB:>7.2f}" for k, _ in MEMORY_COLUMNS)
            + f" {m.total_bytes / GiB:>7.2f} {m.capacity_bytes / GiB:>7.2f}  "
            f"{m.activations_per_microbatch_bytes / GiB:.3f} x {m.in_flight_microbatches:g}"
        )
    for label, key in (("optimizer state", "optimizer_state"), ("activations", "activations")):
        host = [(r.pp_rank, r.memory.host_terms()[key]) for r in report.ranks]
        if any(b > 0 for _, b in host):
            out.append(
                f"{label} offloaded to host memory (GiB per device, not in the total): "
                + ", ".join(f"rank {r} {b / GiB:.2f}" for r, b in host)
            )
    return out


def _mfu_text(problem, report) -> str:
    """MFU by the published convention, and the causal-aware figure where it differs
    (:mod:`nest.cost.mfu`)."""
    if not report.mfu:
        return ", MFU n/a (no FLOPs)"
    text = f", MFU {100 * report.mfu:.1f} % (SC21/Megatron model FLOPs"
    causal = causal_mfu(problem, report)
    if causal is not None and round(100 * causal, 1) != round(100 * report.mfu, 1):
        text += f"; {100 * causal:.1f} % counting only the unmasked causal attention scores"
    fp8 = fp8_peak_mfu(problem, report)
    if fp8 is not None:
        text += f"; of the BF16 peak, {100 * fp8:.1f} % of the FP8 peak"
    text += ")"
    note = plausibility_note(problem, report)
    return text + (f"\nnote: {note}" if note else "")
