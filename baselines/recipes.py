"""``recipes``: what practitioners run today, as published, scored by the shared evaluator.

Two sources, both data in ``conf/recipes.yaml`` with the source of every number:

1. **Published layouts** of the models that have one: NVIDIA NeMo / Megatron-Bridge recipes
   (Llama-2 7B, Llama-3 70B, Llama-3.1 405B, GPT-3 175B, Mixtral 8x7B), the Llama 3 paper's
   405B layouts (Table 4) and torchtitan's (Llama-3 70B, 405B). Each entry keeps its degrees,
   schedule, microbatch, recompute, ZeRO stage and the scale it was published for.
2. **NVIDIA's rule table** (Megatron-Bridge "Parallelism Strategy Selection") for every other
   model, and as the fallback when no published layout can run on the problem.

**Which entry.** The entries for the run's model preset (or for a preset with the run's
architecture: hidden size, blocks, heads, FFN size, vocabulary, experts, so ``model=hf`` on the
same card finds them) whose blocks, hidden size and sequence length are the run's. Each is
adapted to the run (below) and scored by the shared evaluator; the fastest is kept
(``solver.pick=fastest``, the default: a team holding several published layouts for its model
tries them, and the baseline is then the strongest published practice, not an arbitrary one).
``solver.pick=nearest`` takes instead the entry nearest in device count that runs
(``|log2(devices / gpus)|``; a tie goes to the entry published for the run's device preset, then
to the file order). ``search["entries_scored"]`` lists each entry's time and
``search["entries_skipped"]`` why the others could not run.

**Adapting a published layout** to another scale (every change is listed in
``report.json["search"]["adapted"]``; nothing is changed silently):

- ``tp, pp, cp, ep``, the ZeRO stage and sequence parallelism are kept as published.
- ``dp``: the largest number of replicas the devices left after ``tp x cp x pp`` hold that
  divides the run's global batch (with the microbatch) and makes ``ep`` divide ``dp x cp``;
  devices left over stay idle. The global batch is the run's (``training.global_batch``), as
  NVIDIA's performance scripts keep the layout and scale the batch with the GPUs.
- microbatch: the published one when ``training.microbatch_sizes`` offers it; otherwise, or
  when the source does not publish one, every offered size is scored and the fastest kept.
- interleaving: the published ``v`` when it can run here (the ``pp x v`` chunks split the chain
  evenly and the microbatches per replica divide by ``pp``, Megatron's rules), else the largest
  ``v`` below it that can (1: plain 1F1B); a depth the source does not publish (the Llama 3
  paper, torchtitan's interleaved run) is tuned: every ``v`` that can run is scored.
- recompute: the published mode; when it does not fit, the next heavier one (selective, then
  full: Megatron-Bridge's activation-recompute guide).
- layer split: blocks evenly over the chunks when they divide (Megatron's default), otherwise
  the whole chain evenly with the embedding and the loss counted as layers (Megatron's
  ``account_for_embedding/loss_in_pipeline_split``, which the 405B recipes set; the Llama 3
  paper's "one layer fewer on the first and the last stage" is the same split).

A published layout that cannot run (more devices than the cluster has, a degree the model does
not allow, no ``dp`` dividing the batch, ``ep`` not dividing ``dp x cp``, no even split of the
chain, out of memory with full recompute) is not bent further: the rule table plans the run and
``search["fallback"]`` says why.

**The rule table, as published** (each row's text is in the YAML; ranges are inclusive):

- Dense models, by parameter count: < 1B DP only; 1-10B TP 2-4; 10-70B TP 4-8, PP 2-4; 70-175B
  TP 8, PP 4-8; 175-500B TP 8, PP 8-16, CP 2; DP for the rest. Larger models take the last row
  (recorded). Rows are tried from the model's own, then larger ones (more model parallelism,
  when the own row does not fit memory), then smaller ones (when the cluster is too small for
  the own row's degrees).
- Mixtures of experts: TP 1-2, EP as large as the experts and ``dp x cp`` allow ("EP is the
  primary scaling dimension", EP = num_experts or a divisor), PP from the dense row of the
  model's total parameters ("PP handles depth").
- Sequence length: 8K-32K tokens add CP 2, 32K+ CP 4-8 (the sequence rule's CP replaces the
  size row's); below 8K the size row's CP (2 for 175-500B) or none.
- Topology: TP inside one NVLink domain (``tp`` divides the innermost level's fan-out).
- "PP without interleaving has large pipeline bubbles. Use virtual_pipeline_model_parallel_size
  when possible": every ``v`` that can run is scored.
- Distributed optimizer (ZeRO-1) as every Megatron-Bridge recipe; sequence parallelism when
  ``tp > 1``; Megatron rank order ``tp, cp, dp, pp``; recompute none, then selective, then full.

The table gives ranges and leaves the microbatch and the interleaving depth open ("starting
points ... always profile the first iteration"): the planner scores every value the ranges allow
with the shared evaluator and keeps the fastest, as a team trying the published range would.
Not applied: "limited network (Ethernet): TP 4" (a cluster here does not say what its levels
are made of).
"""

import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import yaml

from nest.core.build import PlanSettings, build_plan
from nest.core.errors import Infeasible, InvalidConfiguration, UserError
from nest.core.layers import Shard
from nest.core.plan import Plan
from nest.core.problem import Problem
from nest.core.units import GiB
from nest.cost import evaluate
from nest.dp.space import chunk_split
from nest.planner import finish, infeasible_memory

RECIPES_FILE = Path(__file__).resolve().parent.parent / "conf" / "recipes.yaml"
MODEL_DIR = RECIPES_FILE.parent / "model"
MODES = ("none", "selective", "full")
SOURCES = ("auto", "rules")
PICKS = ("fastest", "nearest")
RANK_ORDER = "tp,cp,dp,pp"


def load_recipes(path: Path | str | None = None) -> dict:
    """``conf/recipes.yaml`` (or ``path``) as a dict with ``recipes`` and ``rule_table``."""
    path = Path(path) if path else RECIPES_FILE
    if not path.is_file():
        raise UserError(f"solver.recipes_file={str(path)!r} does not exist; give a YAML file")
    return yaml.safe_load(path.read_text())


ARCHITECTURE = {"hidden": None, "layers": None, "heads": None, "ffn_hidden": None, "vocab": None}
"""Fields that identify a model's architecture (with ``num_experts``, 1 when absent)."""


@cache
def preset_architecture(name: str) -> tuple | None:
    """The architecture fields of ``conf/model/<name>.yaml`` (None if there is no such preset)."""
    path = MODEL_DIR / f"{name}.yaml"
    if not path.is_file():
        return None
    preset = yaml.safe_load(path.read_text())
    return (*(preset.get(k) for k in ARCHITECTURE), preset.get("num_experts", 1))


def same_architecture(spec, preset: str) -> bool:
    """Whether a run's model (e.g. ``model=hf`` on the same card) is the preset's architecture."""
    mine = (*(getattr(spec, k, None) for k in ARCHITECTURE), getattr(spec, "num_experts", 1))
    return None not in mine and mine == preset_architecture(preset)


def _span(values: Sequence[int] | None) -> list[int]:
    """Every integer of an inclusive published range ``[lo, hi]``."""
    if not values:
        return [1]
    lo, hi = int(values[0]), int(values[-1])
    return list(range(lo, hi + 1))


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """Degrees to run and the knobs left open (scored, fastest kept)."""

    tp: int
    pp: int
    cp: int
    ep: int | None
    """None: the largest divisor of the experts that divides ``dp x cp`` (dense: 1)."""
    vp: int | None
    """Published virtual stages (1: none); None: every ``v`` that can run is scored."""
    microbatch: int | None
    """Published microbatch; None (or not offered by the run): every offered size is scored."""
    recompute: str | None
    """Published recompute mode; heavier ones follow if it does not fit. None: none first."""
    zero_stage: int
    sequence_parallel: bool
    label: str


@dataclass(slots=True)
class Scored:
    """The candidates of one layout (or of one row of the table) and what was learnt."""

    best: tuple[float, Plan] | None = None
    tried: int = 0
    peak_bytes: float | None = None
    problems: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        if text not in self.problems:
            self.problems.append(text)


class RecipesPlanner:
    def __init__(
        self,
        *,
        name: str = "recipes",
        source: str = "auto",
        pick: str = "fastest",
        entry: str | None = None,
        recipes_file: str | None = None,
    ) -> None:
        self.name = name
        self.source = source
        """``auto``: the nearest published layout that runs, else the rule table; ``rules``: the
        rule table only."""
        self.pick = pick
        """``fastest``: every published layout of the model is adapted and scored, the fastest
        kept; ``nearest``: the one nearest in device count that runs."""
        self.entry = entry
        """An entry id of ``conf/recipes.yaml`` to use (None: chosen by device count)."""
        self.recipes_file = recipes_file

    # ------------------------------------------------------------------ published entries
    def entries_for(self, problem: Problem, data: dict) -> tuple[list[dict], str]:
        """Entries for this run's model, nearest in device count first, and why none if none.

        A chosen ``solver.entry`` that is not for this model, architecture or sequence length
        is a user error."""
        spec, n = problem.model.spec, problem.cluster.num_devices
        if self.entry is not None:
            mine = [e for e in data["recipes"] if e["id"] == self.entry]
            if not mine:
                ids = ", ".join(e["id"] for e in data["recipes"])
                raise UserError(
                    f"solver.entry={self.entry!r} is not in the recipes; use one of {ids}"
                )
        else:
            mine = [
                e
                for e in data["recipes"]
                if e["model"] == problem.model.name or same_architecture(spec, e["model"])
            ]
        ok, why = [], []
        for e in mine:
            hidden = getattr(spec, "hidden", None)
            if e["model"] != problem.model.name and not same_architecture(spec, e["model"]):
                why.append(
                    f"{e['id']} is for {e['model']}, the run's model is {problem.model.name}"
                )
            elif (e["layers"], e["hidden"]) != (spec.layers, hidden):
                why.append(
                    f"{e['id']} is for {e['layers']} blocks of hidden size {e['hidden']}, the "
                    f"run's {problem.model.name} has {spec.layers} of {hidden}"
                )
            elif e["seq_len"] != problem.model.seq_len:
                why.append(
                    f"{e['id']} is for sequence length {e['seq_len']}, the run's is "
                    f"{problem.model.seq_len}"
                )
            else:
                ok.append(e)
        if self.entry is not None and not ok:
            raise UserError(f"solver.entry: {why[0]}; choose an entry for this model")
        device = problem.cluster.device.name
        order = {e["id"]: i for i, e in enumerate(ok)}
        ok.sort(
            key=lambda e: (abs(math.log2(n / e["gpus"])), e["device"] != device, order[e["id"]])
        )
        if not mine:
            why.append(f"no published layout for {problem.model.name} in the recipes")
        return ok, "; ".join(why)

    @staticmethod
    def entry_layout(e: dict) -> Layout:
        return Layout(
            tp=e["tp"],
            pp=e["pp"],
            cp=e["cp"],
            ep=e["ep"],
            vp=e["vp"],
            microbatch=e["microbatch"],
            recompute=e["recompute"],
            zero_stage=e["zero_stage"],
            sequence_parallel=bool(e["sequence_parallel"]),
            label=e["id"],
        )

    # ------------------------------------------------------------------ the rule table
    @staticmethod
    def size_row(table: dict, params: float) -> int:
        rows = table["dense"]
        for i, row in enumerate(rows):
            if params < row["max_params_b"] * 1e9:
                return i
        return len(rows) - 1

    @staticmethod
    def sequence_row(table: dict, seq_len: int) -> dict:
        for row in table["sequence"]:
            if seq_len >= row["min_seq"] and (row["max_seq"] is None or seq_len < row["max_seq"]):
                return row
        raise UserError(f"model seq_len={seq_len} is not covered by the rule table's sequence rows")

    def rule_rows(self, problem: Problem, table: dict) -> list[tuple[dict, list[Layout]]]:
        """Per row of the table, in the order tried: its record and its layouts."""
        model = problem.model
        params = model.total_params()
        own = self.size_row(table, params)
        rows = table["dense"]
        order = [own, *range(own + 1, len(rows)), *range(own - 1, -1, -1)]
        seq = self.sequence_row(table, model.seq_len)
        moe = bool(model.spec.is_moe)
        node = problem.cluster.levels[0].fanout
        out = []
        for i in order:
            row = rows[i]
            record = {
                "row": row["size"],
                "text": row["text"],
                "sequence": seq["text"],
                "params_b": round(params / 1e9, 3),
            }
            if i != own:
                record["own_row"] = rows[own]["size"]
            if own == len(rows) - 1 and params >= row["max_params_b"] * 1e9:
                record["beyond_table"] = f"{params / 1e9:.0f}B is above the table's last row"
            tps = _span(table["moe"]["tp"]) if moe else _span(row["tp"])
            if moe:
                record["moe"] = table["moe"]["text"]
            cps = _span(seq["cp"] or row.get("cp"))
            layouts = [
                Layout(
                    tp=tp,
                    pp=pp,
                    cp=cp,
                    ep=None,
                    vp=None,
                    microbatch=None,
                    recompute=None,
                    zero_stage=int(table["zero_stage"]),
                    sequence_parallel=tp > 1,
                    label=f"rule table {row['size']}",
                )
                for tp in tps
                if node % tp == 0  # TP inside one NVLink domain
                for pp in _span(row["pp"])
                for cp in cps
            ]
            out.append((record, layouts))
        return out

    # ------------------------------------------------------------------ scoring
    def _dp(self, problem: Problem, lay: Layout, mbs: int) -> tuple[int, int] | None:
        """(dp, ep) for a layout at microbatch ``mbs``: the most replicas that fit and divide."""
        n, batch = problem.cluster.num_devices, problem.training.global_batch
        spec = problem.model.spec
        for dp in range(n // (lay.tp * lay.cp * lay.pp), 0, -1):
            if batch % (dp * mbs):
                continue
            if lay.ep is None:
                experts = spec.num_experts if spec.is_moe else 1
                ep = max(
                    e for e in range(1, experts + 1) if experts % e == 0 and dp * lay.cp % e == 0
                )
                return dp, ep
            if (dp * lay.cp) % lay.ep == 0:
                return dp, lay.ep
        return None

    @staticmethod
    def _vps(lay: Layout, blocks: int, m: int) -> tuple[list[int], str | None]:
        """Virtual-stage counts to score and, when the published one cannot run, why."""

        def runs(v: int) -> bool:
            if chunk_split(blocks, lay.pp * v) is None:
                return False
            return v == 1 or (lay.pp >= 2 and m % lay.pp == 0)

        limit = max(1, blocks // lay.pp)
        if lay.vp is None:
            return [v for v in range(1, limit + 1) if runs(v)], None
        if runs(lay.vp):
            return [lay.vp], None
        below = [v for v in range(min(lay.vp, limit), 0, -1) if runs(v)]
        why = (
            f"vp={lay.vp} cannot run here (pp x vp = {lay.pp * lay.vp} chunks must split "
            f"{blocks} blocks evenly and the {m} microbatches per replica must divide by pp)"
        )
        return below[:1], why

    def score(self, problem: Problem, lay: Layout, scored: Scored) -> None:
        """Every candidate of one layout, each with the lightest recompute that fits."""
        model, training = problem.model, problem.training
        n, blocks = problem.cluster.num_devices, model.spec.layers
        width = lay.tp * lay.cp * lay.pp
        if width > n:
            scored.note(
                f"{lay.label}: tp x cp x pp = {lay.tp}x{lay.cp}x{lay.pp} = {width} devices, the "
                f"cluster has {n}"
            )
            return
        shard = Shard(tp=lay.tp, cp=lay.cp, sp=lay.sequence_parallel and lay.tp > 1)
        if (why := model.shard_problem(shard)) is not None:
            scored.note(f"{lay.label}: {why}")
            return
        if chunk_split(blocks, lay.pp) is None:
            scored.note(f"{lay.label}: pp={lay.pp} does not split {blocks} blocks evenly")
            return
        offered = sorted(training.microbatch_sizes)
        sizes = [lay.microbatch] if lay.microbatch in offered else offered
        modes = MODES[MODES.index(lay.recompute or "none") :]
        for mbs in sizes:
            got = self._dp(problem, lay, mbs)
            if got is None:
                scored.note(
                    f"{lay.label}: no dp <= {n // width} divides global batch "
                    f"{training.global_batch} / microbatch {mbs}"
                    + (f" with ep={lay.ep} dividing dp x cp" if lay.ep and lay.ep > 1 else "")
                )
                continue
            dp, ep = got
            m = training.global_batch // (mbs * dp)
            vps, why = self._vps(lay, blocks, m)
            if why:
                scored.note(why)
            for v in vps:
                for mode in modes:
                    settings = PlanSettings(
                        tp=lay.tp,
                        pp=lay.pp,
                        dp=dp,
                        cp=lay.cp,
                        ep=ep,
                        microbatch_size=mbs,
                        recompute=mode,
                        zero_stage=lay.zero_stage,
                        schedule="interleaved" if v > 1 else "1f1b",
                        virtual_stages=v,
                        layer_partition=chunk_split(blocks, lay.pp * v),
                        rank_order=RANK_ORDER,
                        sequence_parallel=lay.sequence_parallel and lay.tp > 1,
                    )
                    try:
                        plan = build_plan(problem, settings)
                        report = evaluate(problem, plan)
                    except UserError as exc:
                        scored.note(f"{lay.label}: {exc}")
                        break
                    scored.tried += 1
                    peak = report.peak_memory_bytes
                    scored.peak_bytes = (
                        peak if scored.peak_bytes is None else min(peak, scored.peak_bytes)
                    )
                    if report.feasible:
                        t = report.iteration_time_s
                        if scored.best is None or t < scored.best[0]:
                            scored.best = (t, plan)
                        break

    # ------------------------------------------------------------------ records
    @staticmethod
    def adaptations(problem: Problem, e: dict, plan: Plan, vp_why: list[str]) -> list[str]:
        """What differs from the published entry, and why."""
        n, training = problem.cluster.num_devices, problem.training
        out = []
        if n != e["gpus"]:
            out.append(f"devices {e['gpus']} -> {n}")
        if training.global_batch != e["global_batch"]:
            out.append(
                f"global batch {e['global_batch']} -> {training.global_batch} (the run's "
                "training.global_batch)"
            )
        published_dp = e["gpus"] // (e["tp"] * e["cp"] * e["pp"])
        if plan.dp != published_dp:
            idle = n - plan.devices_used
            out.append(
                f"dp {published_dp} -> {plan.dp} (the most replicas of tp x cp x pp = "
                f"{e['tp'] * e['cp'] * e['pp']} devices that divide the batch"
                + (f"; {idle} devices idle)" if idle else ")")
            )
        if e["microbatch"] is None:
            out.append(f"microbatch not published: {plan.microbatch_size} scored fastest")
        elif plan.microbatch_size != e["microbatch"]:
            out.append(
                f"microbatch {e['microbatch']} -> {plan.microbatch_size} ({e['microbatch']} is "
                f"not in training.microbatch_sizes {list(training.microbatch_sizes)}; the fastest "
                "offered size kept)"
            )
        v = plan.virtual_stages
        if e["vp"] is None:
            out.append(f"interleaving depth not published: vp={v} scored fastest")
        elif v != e["vp"]:
            out.append(f"vp {e['vp']} -> {v}: " + "; ".join(vp_why))
        modes = {s.recompute.value for s in plan.stages}
        mode = modes.pop() if len(modes) == 1 else ",".join(sorted(modes))
        if e["recompute"] is None:
            out.append(f"recompute not published: {mode}, the lightest that fits")
        elif mode != e["recompute"]:
            out.append(f"recompute {e['recompute']} -> {mode} ({e['recompute']} does not fit)")
        return out

    @staticmethod
    def published(e: dict) -> dict:
        keys = ("gpus", "device", "global_batch", "seq_len", "tp", "pp", "cp", "ep", "vp")
        return {k: e[k] for k in (*keys, "microbatch", "recompute", "zero_stage", "source", "url")}

    # ------------------------------------------------------------------ solve
    def solve(self, problem: Problem) -> Plan:
        started = time.perf_counter()
        if self.source not in SOURCES:
            raise UserError(f"solver.source={self.source!r}; use one of {list(SOURCES)}")
        if self.pick not in PICKS:
            raise UserError(f"solver.pick={self.pick!r}; use one of {list(PICKS)}")
        data = load_recipes(self.recipes_file)
        search: dict = {}
        peaks: list[float] = []
        tried = 0
        if self.source == "auto":
            entries, why_none = self.entries_for(problem, data)
            skipped, scored_entries = [], []
            best = None  # (time, plan, entry, scored)
            for e in entries:
                scored = Scored()
                self.score(problem, self.entry_layout(e), scored)
                tried += scored.tried
                if scored.peak_bytes is not None:
                    peaks.append(scored.peak_bytes)
                if scored.best is not None:
                    t = scored.best[0]
                    scored_entries.append({"entry": e["id"], "iteration_time_s": t})
                    if best is None or t < best[0]:
                        best = (t, scored.best[1], e, scored)
                    if self.pick == "nearest":
                        break
                    continue
                reasons = [p for p in scored.problems if not p.startswith("vp=")]
                if scored.peak_bytes is not None and not reasons:
                    hbm = problem.cluster.device.hbm_bytes
                    reasons.append(
                        f"{e['id']}: does not fit memory with full recompute (smallest peak "
                        f"{scored.peak_bytes / GiB:.1f} GiB of {hbm / GiB:.1f} GiB)"
                    )
                skipped.append("; ".join(reasons) or f"{e['id']}: no candidate")
            if best is not None:
                _, plan, e, scored = best
                vp_why = [p for p in scored.problems if p.startswith("vp=")]
                search = {
                    "source": "published",
                    "entry": e["id"],
                    **(
                        {"model_match": f"{problem.model.name} has {e['model']}'s architecture"}
                        if e["model"] != problem.model.name
                        else {}
                    ),
                    "published": self.published(e),
                    "adapted": self.adaptations(problem, e, plan, vp_why),
                    "entries_scored": scored_entries,
                }
                if skipped:
                    search["entries_skipped"] = skipped
                return self._finish(problem, plan, started, tried, search)
            if self.entry is not None:
                raise InvalidConfiguration(f"solver.entry={skipped[0]}")
            search["fallback"] = "; ".join([*([why_none] if why_none else []), *skipped])
        elif self.entry is not None:
            raise UserError("solver.entry needs solver.source=auto (rules uses no entry)")
        table = data["rule_table"]
        problems: list[str] = []
        for record, layouts in self.rule_rows(problem, table):
            scored = Scored()
            for lay in layouts:
                self.score(problem, lay, scored)
            tried += scored.tried
            problems += scored.problems
            if scored.peak_bytes is not None:
                peaks.append(scored.peak_bytes)
            if scored.best is not None:
                search = {"source": "rule_table", "rule": record, **search}
                search["rule_source"] = table["url"]
                return self._finish(problem, scored.best[1], started, tried, search)
        if peaks:
            raise infeasible_memory(problem, self.name, min(peaks))
        raise Infeasible(
            f"no published layout or rule-table layout runs {problem.model.name} on "
            f"{problem.cluster.num_devices} devices: " + "; ".join(problems[:4])
        )

    def _finish(self, problem: Problem, plan: Plan, started: float, tried: int, search: dict):
        search["devices_idle"] = problem.cluster.num_devices - plan.devices_used
        search["candidates_scored"] = tried
        scored, _ = finish(
            self.name, problem, plan, started_s=started, n_evaluations=tried, search=search
        )
        return scored


def iter_entries(path: Path | str | None = None) -> Iterator[dict]:
    """Every published entry of the recipes file (for tests and documentation)."""
    yield from load_recipes(path)["recipes"]
