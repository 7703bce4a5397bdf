"""Measured per-layer profiles as a model: schema and files (:mod:`.schema`), the NEST artifact's
instance files (:mod:`.artifact`), and the model the evaluator and planners use (:mod:`.model`).

``load_profile_model(path, ...)`` reads JSON (``nest-profile-v1`` or a NEST artifact instance,
told apart by their keys) or CSV (by the ``.csv`` suffix).
"""

import json
from pathlib import Path

from nest.core.errors import UserError
from nest.profile.artifact import is_artifact, profile_from_artifact
from nest.profile.model import ProfileModel, ProfileSpec
from nest.profile.schema import (
    LayerProfile,
    Measurement,
    Profile,
    profile_from_dict,
    profile_to_dict,
    read_csv_profile,
    write_profile,
)


def read_profile(
    path_like,
    *,
    name: str | None = None,
    seq_len: int | None = None,
    tp_collectives: str | None = None,
    head_in_blocks: str = "auto",
) -> Profile:
    """A profile from a JSON, CSV or NEST artifact file (``None`` keeps the file's value)."""
    if path_like is None or str(path_like).strip() == "":
        raise UserError(
            "model=profile needs model.path=FILE (.json or .csv, see docs/inputs/profiles.md)"
        )
    path = Path(str(path_like)).expanduser()
    if not path.is_file():
        raise UserError(
            f"model.path={path} does not exist (relative paths are taken from the directory you "
            f"ran from, {Path.cwd()})"
        )
    if path.suffix.lower() == ".csv":
        return read_csv_profile(path, name=name, seq_len=seq_len, tp_collectives=tp_collectives)
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"model.path={path} is neither CSV nor valid JSON: {exc}") from None
    if is_artifact(data):
        if tp_collectives not in (None, "measured"):
            raise UserError(
                f"model.tp_collectives={tp_collectives!r}: the NEST artifact's latencies include "
                "their tensor-parallel traffic; use measured (or leave it null)"
            )
        return profile_from_artifact(
            data, path, head_in_blocks=head_in_blocks, name=name, seq_len=seq_len
        )
    return profile_from_dict(
        data, where=f"model.path={path}", name=name, seq_len=seq_len, tp_collectives=tp_collectives
    )


def load_profile_model(path_like, *, microbatch_scaling: str = "linear", **kw) -> ProfileModel:
    return ProfileModel(read_profile(path_like, **kw), microbatch_scaling=microbatch_scaling)


__all__ = [
    "LayerProfile",
    "Measurement",
    "Profile",
    "ProfileModel",
    "ProfileSpec",
    "load_profile_model",
    "profile_from_dict",
    "profile_to_dict",
    "read_profile",
    "write_profile",
]
