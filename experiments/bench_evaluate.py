"""Benchmark of the shared evaluator: ``python -m experiments.bench_evaluate``.

Prints, per case, the time of the first ``evaluate`` (layer-cost cache cold) and the mean of warm
repeats, and their ratio. Planners call ``evaluate`` in their inner loops, so its warm cost bounds
how many plans a search can score per second.
"""

import time

from hydra import compose, initialize_config_dir

from nest.app.cli import CONF_DIR, register_schemas
from nest.app.config import build_problem
from nest.cost import evaluate

CASES = [
    ("llama2_7b", "dgx_8x8", ["solver=fixed", "solver.tp=8", "solver.pp=2", "solver.dp=4"]),
    (
        "gpt3_175b",
        "dgx_h100_superpod",
        [
            "solver=fixed",
            "solver.tp=8",
            "solver.pp=16",
            "training.global_batch=1536",
            "solver.recompute=full",
        ],
    ),
    (
        "mixtral_8x7b",
        "tpuv4_fattree",
        [
            "solver=fixed",
            "solver.pp=8",
            "solver.ep=8",
            "cluster.devices=1024",
            "training.global_batch=4096",
        ],
    ),
]


def main(repeats: int = 10, rounds: int = 5) -> None:
    """Cold: the first call's wall time (caches empty). Warm: CPU time per call, the fastest of
    ``rounds`` rounds of ``repeats`` calls (CPU time and the minimum keep other processes on a
    shared machine out of the number)."""
    from nest.planner import build_planner

    register_schemas()
    print(f"{'case':<34} {'cold ms':>9} {'warm ms':>9} {'cold/warm':>9}")
    for model, cluster, overrides in CASES:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = compose(
                config_name="config", overrides=[f"model={model}", f"cluster={cluster}", *overrides]
            )
        problem = build_problem(cfg)
        plan = build_planner(cfg.solver).build(problem)
        start = time.perf_counter()
        evaluate(problem, plan)
        cold = time.perf_counter() - start
        warm = float("inf")
        for _ in range(rounds):
            start = time.process_time()
            for _ in range(repeats):
                evaluate(problem, plan)
            warm = min(warm, (time.process_time() - start) / repeats)
        name = f"{model}@{cluster}/{problem.cluster.num_devices}"
        print(f"{name:<34} {cold * 1e3:>9.2f} {warm * 1e3:>9.2f} {cold / warm:>9.2f}")


if __name__ == "__main__":
    main()
