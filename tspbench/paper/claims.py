"""Published TSP numbers (conf/claims.yaml; docs/method.md#published) as plain dicts.

Every claim carries an id, value, unit, scheme, layout (degree, tp, sp; null when unknown), seq_len,
n_gpus, hardware, source, label and note. `tspbench.paper.tables` puts model predictions beside them.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from tspbench.paths import conf_dir

CLAIMS_FILE = conf_dir() / "claims.yaml"
REQUIRED_KEYS = (
    "id",
    "kind",
    "value",
    "unit",
    "scheme",
    "degree",
    "tp",
    "sp",
    "seq_len",
    "n_gpus",
    "hardware",
    "source",
    "label",
    "note",
)


def load_claims(path: str | Path | None = None) -> list[dict]:
    """All claims, in file order; raises ValueError if a claim lacks a field or an id repeats."""
    path = Path(path or CLAIMS_FILE)
    claims = yaml.safe_load(path.read_text())["claims"]
    seen: set[str] = set()
    for c in claims:
        missing = [k for k in REQUIRED_KEYS if k not in c]
        if missing:
            raise ValueError(f"{path}: claim {c.get('id')!r} lacks {missing}")
        if c["id"] in seen:
            raise ValueError(f"{path}: claim id {c['id']!r} repeats")
        seen.add(c["id"])
        c["value"] = float(c["value"])
    return claims


def claim(claim_id: str, path: str | Path | None = None) -> dict:
    """One claim by id."""
    for c in load_claims(path):
        if c["id"] == claim_id:
            return c
    raise KeyError(f"no claim with id {claim_id!r}")


# The experiment whose grid holds each kind of published number (conf/exp/*.yaml): the report names it for a
# claim these results do not answer, instead of a bare "not reproduced".
PRODUCED_BY = {
    "memory": "python -m tspbench +exp=paper_memory",
    "throughput": "python -m tspbench +exp=paper_throughput",
    "ratio": "python -m tspbench +exp=paper_throughput",
}
UNIT_KIND = {"GB": "memory", "tokens/s": "throughput", "x": "ratio"}


def producing_command(c: dict) -> str | None:
    """The command whose records answer claim `c` (its own `command` field wins), or None if none is known."""
    if c.get("command"):
        return str(c["command"])
    return PRODUCED_BY.get(str(c.get("kind") or UNIT_KIND.get(str(c.get("unit")), "")))
