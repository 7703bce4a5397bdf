"""``paper_table``: a row of the NEST paper's fixed baseline tables, scored by the shared evaluator.

``python run.py solver=paper_table solver.table=Manual model=llama2_7b cluster=tpuv4_fattree
cluster.devices=512 training.global_batch=4096`` looks up the row (setup from the cluster,
devices from ``cluster.devices``, model from the preset; microbatch-variant tables with
``solver.microbatch_size``) in ``conf/paper_tables.yaml`` (converted from the artifact by
``experiments/convert_paper_tables.py``) and turns it into a plan, then the ``fixed`` planner's
path scores it. How the artifact's fields map (each choice from its fixed-configuration evaluator,
docs/nest_paper.md §2 and §6):

- ``t`` -> ``tp``; ``p`` -> ``pp``; ``d`` -> ``dp``, except Mixtral: the artifact's stage is
  ``t x ep`` devices wide with ``ep = 4`` and its batch has ``4096 / (mbs x 4)`` microbatches, so
  each of the 4 devices takes its own samples: ``ep = 4`` and ``dp = 4 d`` here (expert ranks are
  carved out of the data ranks). Devices used: ``p d t`` (x 4 for Mixtral).
- Layer split: the artifact gives stage ``k`` the blocks ``[k c, min((k+1) c, L))`` with
  ``c = ceil(L / p)`` (not a balanced split), the embedding to stage 0 and the head to stage
  ``p - 1``; ``layer_partition`` (blocks per stage) replaces it when given. A stage left with no
  layer makes the row invalid as published.
- Recompute: on for every model but BERT (the artifact's ``activationRecomputation``); the
  artifact keeps only stage inputs and recomputes on every stage but the last, which holds one
  microbatch: ``full`` on stages ``0..p-2`` and ``none`` on the last. BERT: ``none``.
- Microbatch 1 (``solver.microbatch_size`` selects the ``_mbs2/_mbs4/_mbs8`` tables).
- Placement: the artifact puts a stage's ``t`` devices next to each other, the stages of a
  replica next, replicas outermost: rank order ``tp, cp, pp, dp``. Mixtral: ``tp, cp, dp, pp``,
  which keeps each 4-device expert group on consecutive devices as the artifact does (for
  ``d = 1`` the two layouts are the same device for device; for ``d > 1`` the replicas of a stage
  sit next to each other instead of the stages of a replica).
- No ZeRO, no sequence parallelism (the artifact's baselines have neither; override with
  ``solver.zero_stage`` / ``solver.sequence_parallel``); 1F1B. The optimizer is the run's
  ``training.optimizer`` (``sgd`` mirrors the artifact's scripts).

Rows that cannot run as published (more devices than the cluster has, a ``dp`` that does not
divide the batch, a ``tp`` the heads do not allow, empty stages, no preset) raise
:class:`nest.core.errors.InvalidConfiguration` listing every broken rule: the run reports status
``invalid``. ``solver.variant=nearest_valid`` instead runs the nearest plan that is valid (``dp``
lowered to the largest value that divides the batch and fits, a balanced split when the
published one leaves a stage empty), labelled so in ``report.json["search"]``.
"""

import time
from math import ceil
from pathlib import Path

import yaml

from baselines.fixed import FixedPlanner
from nest.core.errors import InvalidConfiguration, NotPublished, UserError, yaml_error_text
from nest.core.layers import Shard
from nest.core.plan import Plan, uniform_partition
from nest.core.problem import Problem
from nest.planner import finish

TABLES_FILE = Path(__file__).resolve().parent.parent / "conf" / "paper_tables.yaml"
SETUP_OF_CLUSTER = {"tpuv4_fattree": "tpuv4_fatTree", "h100_spineleaf": "h100_spineLeaf"}
TABLES = ("Manual", "MCMC", "Phaze")
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: 6x faster
MIXTRAL_EP = 4  # the artifact's ep_degree for Mixtral (docs/nest_paper.md §2)


def artifact_split(blocks: int, p: int) -> list[int]:
    """Blocks per stage under the artifact's fixed-configuration rule: ``ceil(L/p)`` each, in
    order, until the blocks run out (later stages may get none)."""
    c = ceil(blocks / p)
    return [max(0, min((k + 1) * c, blocks) - min(k * c, blocks)) for k in range(p)]


def _read_rows(path: Path) -> list[dict]:
    """The ``rows`` of a tables file; a missing or malformed file is a one-line error naming it
    (and, for a YAML error, the line)."""
    try:
        with path.open(encoding="utf-8") as f:
            data = yaml.load(f, Loader=SAFE_LOADER)
    except OSError as exc:
        raise UserError(
            f"solver.tables_file={str(path)!r} cannot be read ({exc.strerror or exc})"
        ) from None
    except yaml.YAMLError as exc:
        raise UserError(f"solver.tables_file: malformed YAML: {yaml_error_text(exc)}") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"solver.tables_file={str(path)!r} is not UTF-8 text ({exc})") from None
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        raise UserError(
            f"solver.tables_file={str(path)!r} has no 'rows' list (the layout of "
            "conf/paper_tables.yaml)"
        )
    return rows


class PaperTablePlanner:
    scores_given_plan = True
    """A published row that does not fit is scored and flagged, not refused
    (nest.planner.Planner)."""

    def __init__(
        self,
        *,
        name: str = "paper_table",
        table: str = "Manual",
        setup: str | None = None,
        devices: int | None = None,
        artifact_model: str | None = None,
        microbatch_size: int = 1,
        zero_stage: int = 0,
        sequence_parallel: bool = False,
        variant: str = "as_published",
        tables_file: str | None = None,
    ) -> None:
        self.name = name
        self.table = table
        """``Manual``, ``MCMC`` or ``Phaze``."""
        self.setup = setup
        """The artifact's setup key; null: from the cluster preset's name."""
        self.devices = devices
        """Which scale's row; null: the cluster's device count."""
        self.artifact_model = artifact_model
        """The artifact's model key; null: the one standing for the run's model preset."""
        self.microbatch_size = microbatch_size
        """1, or 2/4/8 for the microbatch-variant tables."""
        self.zero_stage = zero_stage
        self.sequence_parallel = sequence_parallel
        self.variant = variant
        """``as_published`` or ``nearest_valid``."""
        self.tables_file = tables_file

    def row(self, problem: Problem) -> dict:
        """The table row this run asks for (``NotPublished`` when there is none)."""
        if self.table not in TABLES:
            raise UserError(f"solver.table={self.table!r}; use one of {list(TABLES)}")
        if self.variant not in ("as_published", "nearest_valid"):
            raise UserError(f"solver.variant={self.variant!r}; use as_published or nearest_valid")
        setup = self.setup or SETUP_OF_CLUSTER.get(problem.cluster.name)
        if setup is None:
            raise UserError(
                f"no paper table for cluster {problem.cluster.name}; use cluster=tpuv4_fattree "
                "or cluster=h100_spineleaf, or set solver.setup"
            )
        if self.microbatch_size != 1:
            setup = f"{setup}_mbs{self.microbatch_size}"
        devices = self.devices or problem.cluster.num_devices
        path = Path(self.tables_file) if self.tables_file else TABLES_FILE
        rows = _read_rows(path)
        match = [
            r
            for r in rows
            if (r["setup"], r["devices"], r["table"]) == (setup, devices, self.table)
            and (
                r["artifact_model"] == self.artifact_model
                if self.artifact_model
                else r["model"] == problem.model.name
            )
        ]
        if not match:
            have = sorted(
                {
                    r["devices"]
                    for r in rows
                    if r["setup"] == setup
                    and r["table"] == self.table
                    and self.artifact_model in (None, r["artifact_model"])
                    and (self.artifact_model or r["model"] == problem.model.name)
                }
            )
            elsewhere = (
                f"it has rows at {', '.join(map(str, have))} devices"
                if have
                else "it has none for this model"
            )
            raise NotPublished(
                f"the paper's {self.table} table has no row for "
                f"{self.artifact_model or problem.model.name} on {setup} at {devices} devices; "
                + elsewhere
            )
        if len(match) > 1:  # e.g. two keys for one preset: the rows for the model's depth
            deep = [r for r in match if r["num_transformer_layers"] == problem.model.spec.layers]
            match = deep or match
        if len({(r["p"], r["d"], r["t"]) for r in match}) > 1:
            keys = [r["artifact_model"] for r in match]
            raise UserError(f"rows {keys} disagree; choose one with solver.artifact_model")
        return match[0]

    def _dp_reason(self, problem: Problem, dp: int, d: int, ep: int) -> str | None:
        batch, mbs = problem.training.global_batch, self.microbatch_size
        if batch % (mbs * dp) == 0:
            return None
        what = f"dp = {ep} x d{d} = {dp}" if ep > 1 else f"dp={dp}"
        per = f" / microbatch {mbs}" if mbs > 1 else ""
        return f"{what} does not divide global batch {batch}{per}"

    def _blocks(self, row: dict, blocks: int) -> list[int]:
        part = row.get("layer_partition")
        return list(part) if part else artifact_split(blocks, row["p"])

    def _model_reasons(self, problem: Problem, row: dict, ep: int) -> list[str]:
        """What in the row does not fit the run's model: preset, depth, tensor degree."""
        spec = problem.model.spec
        reasons = []
        if row["model"] is None:
            reasons.append(f"artifact model {row['artifact_model']!r} has no preset")
        elif row["model"] != problem.model.name:
            reasons.append(f"the row is for {row['model']}, the run's is {problem.model.name}")
        if row["num_transformer_layers"] != spec.layers:
            reasons.append(
                f"the row splits {row['num_transformer_layers']} blocks, {spec.name} has "
                f"{spec.layers}"
            )
        t = row["t"]
        shard = Shard(tp=t, ep=ep, sp=self.sequence_parallel and t > 1)
        if (why := problem.model.shard_problem(shard)) is not None:
            reasons.append(why)
        return reasons

    def map_row(self, problem: Problem, row: dict) -> tuple[dict, list[str], list[str]]:
        """Fixed-planner arguments of a row, the rules it breaks, and the changes the
        ``nearest_valid`` variant made (module docstring)."""
        spec = problem.model.spec
        p, d, t = row["p"], row["d"], row["t"]
        ep = MIXTRAL_EP if row["artifact_model"] == "mixtral" else 1
        n = problem.cluster.num_devices
        nearest = self.variant == "nearest_valid"
        reasons, changes = self._model_reasons(problem, row, ep), []
        blocks = self._blocks(row, spec.layers)
        if len(blocks) != p or sum(blocks) != spec.layers:
            reasons.append(f"layer_partition {blocks} does not split {spec.layers} blocks in p{p}")
        empty = [k for k, b in enumerate(blocks) if b == 0 and k not in (0, p - 1)]
        if empty and p <= problem.num_layers and nearest:
            counts = uniform_partition(problem.num_layers, p)
            changes.append(f"stages {empty} were empty: balanced split {counts}")
        elif empty:
            reasons.append(
                f"the artifact's split of {spec.layers} blocks into p{p} stages "
                f"({ceil(spec.layers / p)} per stage) leaves stages {empty} empty"
            )
        else:
            counts = list(blocks)
            counts[0] += 1  # embedding
            counts[-1] += 1  # head
        dp = d * ep
        if nearest:
            ok = [
                x
                for x in range(d, 0, -1)
                if self._dp_reason(problem, x * ep, x, ep) is None and p * x * t * ep <= n
            ]
            if ok and ok[0] != d:
                changes.append(f"d{d} -> d{ok[0]} (largest that divides the batch and fits)")
                d, dp = ok[0], ok[0] * ep
        used = p * d * t * ep
        if used > n:
            factors = f"p{p} x d{d} x t{t}" + (f" x ep{ep}" if ep > 1 else "")
            reasons.append(f"{factors} = {used} devices but the cluster has {n}")
        if (why := self._dp_reason(problem, dp, d, ep)) is not None:
            reasons.append(why if used > n else f"{why} (p{p} x d{d} = {used} of {n} devices)")
        modes = ["none"] * p if row["model"] == "bert_large" else ["full"] * (p - 1) + ["none"]
        kwargs = dict(
            tp=t,
            pp=p,
            dp=dp,
            ep=ep,
            microbatch_size=self.microbatch_size,
            recompute=modes,
            zero_stage=self.zero_stage,
            layer_partition=None if reasons else counts,
            rank_order="tp,cp,dp,pp" if ep > 1 else "tp,cp,pp,dp",
            sequence_parallel=self.sequence_parallel,
        )
        return kwargs, reasons, changes

    def solve(self, problem: Problem) -> Plan:
        started = time.perf_counter()
        row = self.row(problem)
        label = (
            f"{row['table']} {row['artifact_model']} on {row['setup']} at {row['devices']}: "
            f"p{row['p']} d{row['d']} t{row['t']}"
        )
        kwargs, reasons, changes = self.map_row(problem, row)
        if reasons:
            variant = " (nearest valid)" if self.variant == "nearest_valid" else " as published"
            raise InvalidConfiguration(f"{label}{variant}: " + "; ".join(reasons))
        try:
            plan = FixedPlanner(name=self.name, **kwargs).build(problem)
        except UserError as exc:
            raise InvalidConfiguration(f"{label}: {exc}") from None
        search = {
            "row": dict(row),
            "variant": self.variant,
            "changes": changes,
            "devices_idle": problem.cluster.num_devices - plan.devices_used,
        }
        plan, _ = finish(
            self.name, problem, plan, started_s=started, n_evaluations=1, search=search
        )
        return plan
