"""Plans and reports as JSON-ready dictionaries (``plan.json``, ``report.json``)."""

from nest.core.axes import Axis, Recompute, Schedule
from nest.core.plan import ParallelConfig, Plan, StagePlan
from nest.core.report import Report


def _choices(plan: Plan) -> dict:
    """The plan's degrees and discrete choices (shared by plan.json and report.json)."""
    return {
        "tp": plan.tp,
        "cp": plan.cp,
        "ep": plan.ep,
        "etp": plan.config.expert_tp,
        "dp": plan.dp,
        "pp": plan.pp,
        "microbatch_size": plan.microbatch_size,
        "num_microbatches": plan.num_microbatches,
        "zero_stage": plan.zero_stage,
        "optimizer_offload": plan.optimizer_offload,
        "activation_offload": plan.activation_offload,
        **(
            {"activation_offload_blocks": plan.activation_offload_blocks}
            if plan.activation_offload_blocks is not None
            else {}
        ),
        "zero_shard": plan.zero_shard,
        "schedule": str(plan.schedule),
        "virtual_stages": plan.virtual_stages,
        "sequence_parallel": plan.sequence_parallel,
        "rank_order": [str(a) for a in plan.rank_order] if plan.rank_order else None,
    }


def plan_to_dict(plan: Plan) -> dict:
    """The whole plan, explicit devices included; :func:`plan_from_dict` reads it back."""
    return {
        **_choices(plan),
        "stages": [
            {
                "layers": [s.first_layer, s.last_layer],
                "recompute": str(s.recompute),
                **({"full_blocks": s.full_blocks} if s.full_blocks else {}),
                "devices": [[list(ranks) for ranks in rep] for rep in s.devices],
            }
            for s in plan.stages
        ],
        "solver": plan.solver,
        "status": plan.status,
        "solve_time_s": plan.solve_time_s,
        "objective_s": plan.objective_s,
        "bound_s": plan.bound_s,
        "n_evaluations": plan.n_evaluations,
        "search": dict(plan.search),
    }


def plan_from_dict(d: dict) -> Plan:
    return Plan(
        config=ParallelConfig(
            tp=d["tp"],
            cp=d["cp"],
            ep=d["ep"],
            etp=d.get("etp"),
            dp=d["dp"],
            pp=d["pp"],
            microbatch_size=d["microbatch_size"],
            zero_stage=d["zero_stage"],
            optimizer_offload=bool(d.get("optimizer_offload", False)),
            activation_offload=bool(d.get("activation_offload", False)),
            activation_offload_blocks=d.get("activation_offload_blocks"),
            zero_shard=d.get("zero_shard"),
            schedule=Schedule(d["schedule"]),
            virtual_stages=d.get("virtual_stages", 1),
            rank_order=tuple(Axis(a) for a in d["rank_order"]) if d.get("rank_order") else None,
        ),
        num_microbatches=d["num_microbatches"],
        sequence_parallel=d.get("sequence_parallel", False),
        stages=tuple(
            StagePlan(
                first_layer=s["layers"][0],
                last_layer=s["layers"][1],
                recompute=Recompute(s["recompute"]),
                full_blocks=s.get("full_blocks", 0),
                devices=tuple(tuple(tuple(r) for r in rep) for rep in s["devices"]),
            )
            for s in d["stages"]
        ),
        solver=d.get("solver", ""),
        status=d.get("status", "feasible"),
        solve_time_s=d.get("solve_time_s", 0.0),
        objective_s=d.get("objective_s"),
        bound_s=d.get("bound_s"),
        n_evaluations=d.get("n_evaluations", 0),
        search=d.get("search", {}),
    )


def report_to_dict(plan: Plan, report: Report) -> dict:
    """``report.json``: the headline numbers, the plan summary and every evaluated term.

    The top-level names are stable (later issues extend, never rename them).
    """
    rank_memory = {r.pp_rank: r.memory.total_bytes for r in report.ranks}
    return {
        "solver": plan.solver,
        "status": plan.status,
        "feasible": report.feasible,
        "violation": report.violation,
        "iteration_time_s": report.iteration_time_s,
        "throughput_samples_per_s": report.throughput_samples_per_s,
        "tokens_per_s": report.tokens_per_s,
        "mfu": report.mfu,
        "solve_time_s": plan.solve_time_s,
        "devices_used": report.devices_used,
        "devices_idle": report.devices_idle,
        "peak_memory_bytes": report.peak_memory_bytes,
        "memory": {
            # per pipeline rank, the disjoint terms of one device's memory, which sum to its
            # total (:meth:`nest.core.report.MemoryReport.terms`), bytes
            "terms": [
                {
                    "pp_rank": r.pp_rank,
                    **r.memory.terms(),
                    "total": r.memory.total_bytes,
                    # in host memory, outside the total (optimizer offload)
                    "host_optimizer_state": r.memory.host_optimizer_bytes,
                    "host_activations": r.memory.host_activations_bytes,
                    "capacity": r.memory.capacity_bytes,
                    "activations_per_microbatch": r.memory.activations_per_microbatch_bytes,
                    "in_flight_microbatches": r.memory.in_flight_microbatches,
                }
                for r in report.ranks
            ],
        },
        "plan": {
            **_choices(plan),
            "stages": [
                {
                    "layers": [s.first_layer, s.last_layer],
                    "recompute": str(plan.stages[s.index].recompute),
                    "full_blocks": plan.stages[s.index].full_blocks,
                    "pp_rank": s.pp_rank,
                    "memory_bytes": rank_memory[s.pp_rank],
                    "time_s": s.time_s,
                }
                for s in report.stages
            ],
        },
        "search": {
            "n_evaluations": plan.n_evaluations,
            "objective_s": plan.objective_s,
            "bound_s": plan.bound_s,
            **dict(plan.search),
        },
        "breakdown": report.to_dict(),
    }
