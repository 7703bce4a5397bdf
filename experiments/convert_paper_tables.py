"""Convert the NEST artifact's fixed baseline tables to ``conf/paper_tables.yaml``.

``python -m experiments.convert_paper_tables [SOURCE] [--out FILE]``

SOURCE is the artifact's ``baseline_tables.json`` (docs/nest_paper.md §6): ``{setup: {devices:
{Manual | MCMC | Phaze: {artifact model: {p, d, t, num_transformer_layers[, layer_partition]}}}}}``;
by default ``../shared/reference-instances/baseline_tables.json`` beside the repository. The output
is one tidy row per (setup, devices, table, artifact model) with the artifact's fields unchanged
and one added column, ``model``: the preset the artifact's model key stands for (null when no
preset does). :func:`tables_from_rows` inverts the conversion exactly (a test checks it).
"""

import argparse
import json
import sys
from pathlib import Path

import yaml

from nest.core.files import write_text

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "conf" / "paper_tables.yaml"
SOURCE_NAME = Path("reference-instances") / "baseline_tables.json"

# The artifact's model keys and the presets they stand for (docs/nest_paper.md §6). "gpt3_small" and
# "gpt_small" appear only in the h100_spineLeaf tables and are not the 175B model the paper
# reports; no preset stands for them.
PRESET_OF = {
    "megatronbert": "bert_large",
    "bertlarge": "bert_large",
    "llama2": "llama2_7b",
    "llama3": "llama3_70b",
    "mixtral": "mixtral_8x7b",
    "megatrongpt3": "gpt3_175b",
    "gpt3_small": None,
    "gpt_small": None,
}
FIELDS = ("p", "d", "t", "num_transformer_layers", "layer_partition")

HEADER = """\
# The NEST artifact's fixed baseline configurations ("Manual", "MCMC", "Phaze" tables), one row per
# (setup, devices, table, artifact model), converted from reference-instances/baseline_tables.json
# by experiments/convert_paper_tables.py (regenerate: python -m experiments.convert_paper_tables).
# Fields as the artifact has them: p pipeline stages, d data-parallel replicas, t tensor degree,
# num_transformer_layers, optional layer_partition (blocks per stage). `model` is the preset the
# artifact's model key stands for (null: none). Run a row with solver=paper_table (see
# baselines/paper_table.py for how each field maps onto a plan). Rows are kept as published, even
# those that cannot run as given (more devices than the setup has, d not dividing the batch).
"""


def default_source() -> Path:
    """The artifact's tables beside the repository (``../shared`` of a checkout or worktree)."""
    for base in (ROOT.parent, ROOT.parent.parent):
        path = base / "shared" / SOURCE_NAME
        if path.is_file():
            return path
    return ROOT.parent / "shared" / SOURCE_NAME


def rows_from_tables(tables: dict) -> list[dict]:
    """One row per leaf of the nested tables, sorted by (setup, devices, table, model key)."""
    rows = []
    for setup, by_devices in tables.items():
        for devices, by_table in by_devices.items():
            for table, by_model in by_table.items():
                for key, entry in by_model.items():
                    unknown = set(entry) - set(FIELDS)
                    if unknown:
                        raise ValueError(f"{setup}/{devices}/{table}/{key}: fields {unknown}")
                    if key not in PRESET_OF:
                        raise ValueError(f"artifact model {key!r} has no entry in PRESET_OF")
                    row = {
                        "setup": setup,
                        "devices": int(devices),
                        "table": table,
                        "artifact_model": key,
                        "model": PRESET_OF[key],
                    }
                    row.update({f: entry[f] for f in FIELDS if f in entry})
                    rows.append(row)
    rows.sort(key=lambda r: (r["setup"], r["devices"], r["table"], r["artifact_model"]))
    return rows


def tables_from_rows(rows: list[dict]) -> dict:
    """The nested tables back from the rows (the inverse of :func:`rows_from_tables`)."""
    out: dict = {}
    for row in rows:
        leaf = {f: row[f] for f in FIELDS if f in row}
        devices = str(row["devices"])
        by_table = out.setdefault(row["setup"], {}).setdefault(devices, {})
        by_table.setdefault(row["table"], {})[row["artifact_model"]] = leaf
    return out


def dump_rows(rows: list[dict]) -> str:
    """YAML text: the header and one flow-style mapping per row (stable, diff-friendly)."""
    lines = [HEADER, "rows:"]
    for row in rows:
        text = yaml.safe_dump(row, default_flow_style=True, sort_keys=False, width=10_000)
        lines.append(f"  - {text.strip()}")
    return "\n".join(lines) + "\n"


def load_rows(path: Path = OUT) -> list[dict]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(path.read_text(), Loader=loader)["rows"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", nargs="?", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    source = args.source or default_source()
    if not source.is_file():
        print(f"error: {source} not found; pass the path of baseline_tables.json", file=sys.stderr)
        return 2
    rows = rows_from_tables(json.loads(source.read_text()))
    write_text(args.out, dump_rows(rows))
    print(f"wrote {len(rows)} rows to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
