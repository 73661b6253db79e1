"""Result records -> tables -> one self-contained HTML file (+ CSV and Markdown beside it).

The report reads records, nothing else: each input file once (tspbench.record.store.read_all, every kind in one
pass), never logs, never a file it was not given, never its own output; it runs no planner, validator or estimate.
Flow:

    read_all -> run records: de-duplicate by run_id (last wins) -> flat rows (frame.py)
             -> claims-vs-ours rows (claims.py), per-scheme summary, failures, provenance    (this file)
             -> figures (figures.py, inline SVG data: URIs)
             -> validation records -> trust.py; plan records -> pareto.py
    -> templates/report.html.j2; the claim rows go back to the caller (`make_report`), so tspbench.report.finish
       prints them without re-reading the Markdown export.

Every derived number says what it was derived from (e.g. "peak reserved GiB x 1.073741824 -> GB"), because
records mix measured GPU runs, CPU (gloo) runs and estimated/modelled predictions. Memory is printed in GB.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from jinja2 import Environment, FileSystemLoader, select_autoescape

from tspbench.parallel import SCHEME_REGISTRY
from tspbench.paths import reports_dir, templates_dir
from tspbench.record.schema import CPU_NOTE
from tspbench.record.store import RecordSet, read_all
from tspbench.record.tables import clean_reason
from tspbench.report.claims import LABELS_LEGEND, claims_table, grouped_claims, load_claim_list, verdict
from tspbench.report.frame import MEM_PARTS, WITHIN_PCT, fmt, fmt_seq, frame_of, gb, num, records

# ---------------------------------------------------------------- other tables --------------------


def summary_rows(df: pd.DataFrame) -> list[dict]:
    """Per-scheme summary: one row per run, already sorted by scheme / layout / sequence length."""
    out = []
    for r in records(df):
        # Memory in GB, like the paper (records store GiB; docs/records.md).
        parts = [f"{short} {fmt(gb(r.get(k)))}" for k, short in MEM_PARTS if num(r.get(k)) is not None]
        alloc, res = gb(r.get("peak_allocated_gib")), gb(r.get("peak_reserved_gib"))
        peak = (
            f"{fmt(alloc)} / {fmt(res)}"
            if alloc is not None or res is not None
            else (f"{fmt(gb(r['mem_gib']))} ({r['mem_basis']})" if r["mem_gib"] is not None else "—")
        )
        out.append(
            {
                "label": r["label"],
                "seq": fmt_seq(r.get("seq_len")),
                "batch": fmt(r.get("batch"), 0),
                "mode": r.get("mode") or "—",
                "model": r.get("model") or "—",
                "method": r["method"],
                "hw": r["hw"],
                "is_cpu": r["is_cpu"],
                "tok": fmt(r["tok"], 3),
                "tok_dev": fmt(r["tok_dev"], 3),
                "tok_pred": r["tok_basis"] == "predicted_tokens_per_s",
                "mfu": f"{fmt(r.get('mfu_causal_pct'), 1)} / {fmt(r.get('mfu_noncausal_pct'), 1)}",
                "step": f"{fmt(r['step_min'], 1)} / {fmt(r['step_p50'], 1)} / {fmt(r['step_max'], 1)}",
                "peak": peak,
                "breakdown": ", ".join(parts) or "—",
                "j_tok": fmt(r.get("energy_j_per_token"), 3),
                "j_tok_why": r.get("energy_reason") or "",
                "status": r["status"],
            }
        )
    return out


def failure_rows(df: pd.DataFrame) -> list[dict]:
    if df.empty:
        return []
    bad = df[df["status"] != "ok"]
    return [
        {
            "run_id": r.get("run_id") or "—",
            "label": r["label"],
            "seq": fmt_seq(r.get("seq_len")),
            "method": r["method"],
            "hw": r["hw"],
            "status": r["status"],
            # A log tail can be long; its end is where the error is.
            "reason": (
                clean_reason(r.get("reason"))[-1500:] if r.get("reason") not in (None, "") else "no reason recorded"
            ),
        }
        for r in records(bad)
    ]


def provenance_rows(df: pd.DataFrame) -> tuple[list[dict], list[dict]]:
    """(one row per run, one entry per distinct resolved config with the runs that used it)."""
    runs: list[dict] = []
    configs: dict[str, list[str]] = {}
    for r in records(df):
        p = r["provenance"] or {}
        commit = str(p.get("git_commit") or "—")[:12] + (" (dirty)" if p.get("git_dirty") else "")
        runs.append(
            {
                "run_id": r.get("run_id") or "—",
                "commit": commit,
                "versions": " · ".join(f"{k} {p[k]}" for k in ("torch", "nccl", "driver") if p.get(k)) or "—",
                "host": p.get("hostname") or "—",
                "devices": ", ".join(map(str, p.get("device_names") or [])) or r["hw"],
                "seed": p.get("seed", "—"),
                "steps": f"{p.get('warmup_steps', '—')} + {p.get('measured_steps', '—')}",
                "when": f"{p.get('started_at') or '—'} → {p.get('finished_at') or '—'}",
            }
        )
        if p.get("config") is not None:
            text = json.dumps(p["config"], indent=2, sort_keys=True, default=str)
            configs.setdefault(text, []).append(str(r.get("run_id")))
    return runs, [{"runs": ", ".join(ids), "text": t} for t, ids in configs.items()]


# ---------------------------------------------------------------- exports and rendering -----------

CSV_COLUMNS = (
    "id",
    "claim",
    "tag",
    "scheme",
    "seq_len",
    "n_gpus",
    "claimed",
    "unit",
    "ours",
    "deviation_pct",
    "within",
    "method",
    "hardware",
    "layout",
    "model",
    "basis",
    "run_id",
    "source",
)


MD_HEAD = ("claim", "paper", "ours", "deviation", "method", "hardware", "layout", "basis")


def markdown_lines(rows: list[dict]) -> list[str]:
    """The claimed-vs-reproduced rows as a Markdown table (header and rule first)."""
    lines = ["| " + " | ".join(MD_HEAD) + " |", "|" + "---|" * len(MD_HEAD)]
    for r in rows:
        cells = [
            r["claim"],
            f"{fmt(r['claimed'])} {r['unit']}",
            f"{fmt(r['ours'])} {r['unit']}" if r["ours"] is not None else "—",
            f"{r['deviation_pct']:+.1f}%" if r["deviation_pct"] is not None else "—",
            r["method"] or "—",
            r["hardware"] or "—",
            r["layout"] or "—",
            r["basis"],
        ]
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    return lines


def write_exports(rows: list[dict], csv_path: Path, md_path: Path) -> None:
    table = pd.DataFrame(rows, columns=list(CSV_COLUMNS))
    table.to_csv(csv_path, index=False)
    md_path.write_text("\n".join(markdown_lines(rows)) + "\n")


@dataclass
class Built:
    """What `make_report` wrote and computed: the HTML path (CSV and Markdown beside it) and the claimed-vs-reproduced
    rows (claims.claims_table) those exports hold."""

    path: Path
    claim_rows: list[dict]


def answer_of(records: list[dict]) -> dict | None:
    """The first screen's answer to "does TSP win, against what, by how much, how sure" from the verdict records
    (tspbench/predict/verdict.py via tspbench/run/context.py); None without one. An implausible record is shown
    as such, never as an answer."""
    good = [r for r in records if r.get("status") == "ok"]
    if not good:
        if records:
            return {
                "headline": "no answer: the verdict record is implausible",
                "detail": records[0].get("reason", ""),
                "setting": records[0].get("setting", ""),
            }
        return None
    r = good[0]
    return {
        "headline": f"{r['verdict'][0].upper()}{r['verdict'][1:]}: TSP ÷ {r['b']} = {r['ratio_central']:.2f}× "
        f"(band {r['ratio_low']:.2f}–{r['ratio_high']:.2f}).",
        "detail": f"TSP at its best, {r['a']}, against the strongest baseline at its best, {r['b']}, over "
        f"{r['scenarios']} shared scenarios of kernel efficiency, link efficiency, overlap and kernel-shape pricing; "
        f"{r['moves_most']}.",
        "setting": r["setting"],
    }


def make_report(
    paths: list[str | Path],
    out: Path | None = None,
    title: str | None = None,
    *,
    claims: list[dict] | None = None,
    inputs: RecordSet | None = None,
) -> Built:
    """Build the HTML report from JSONL files/directories. Writes `<stem>.csv` and `<stem>.md` (claimed vs
    reproduced) beside it. `inputs`: the records of `paths` already read (tspbench.record.store.read_all; the
    command line reads them once to check them), else they are read here, once. `claims` overrides
    tspbench.paper.claims (tests use it)."""
    from tspbench.report.figures import make_figures  # matplotlib import is slow; only when building
    from tspbench.report.pareto import pareto_section
    from tspbench.report.trust import trust_section

    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(out) if out is not None else reports_dir() / f"report-{stamp}.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out.with_suffix(".csv"), out.with_suffix(".md")

    inputs = inputs if inputs is not None else read_all(paths)
    df, n_raw = frame_of(inputs.of(None))
    claims_source = "given by caller"
    if claims is None:
        claims, claims_source = load_claim_list()
    crow = claims_table(claims, df)
    write_exports(crow, csv_path, md_path)
    runs, configs = provenance_rows(df)
    figures = make_figures(df, claims, {kind: inputs.of(kind) for kind in ("crossover", "fit")})
    groups = grouped_claims(crow)

    env = Environment(
        loader=FileSystemLoader(templates_dir()),
        autoescape=select_autoescape(["html", "j2"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(fmt=fmt, fmt_seq=fmt_seq)
    html = env.get_template("report.html.j2").render(
        title=title or "tspbench report: TSP claims vs these results",
        generated=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        sources=[str(p) for p in paths],
        n_raw=n_raw,
        n_runs=len(df),
        claims_source=claims_source,
        groups=groups,
        verdict=verdict(groups, claims_source),
        answer=answer_of(inputs.of("verdict")),
        labels_legend=LABELS_LEGEND.format(pct=WITHIN_PCT),
        schemes=list(SCHEME_REGISTRY.values()),
        within_pct=WITHIN_PCT,
        any_cpu=bool(not df.empty and df["is_cpu"].any()),
        cpu_note=CPU_NOTE,
        summary=summary_rows(df),
        figures=[f for f in figures if f["src"]],
        empty_figures=[f for f in figures if not f["src"]],
        failures=failure_rows(df),
        trust=trust_section(inputs.of("validation"), inputs.of("verdict"), inputs.of("peer_estimate")),
        pareto=pareto_section(inputs.of("plan")),
        runs=runs,
        configs=configs,
        csv_name=csv_path.name,
        md_name=md_path.name,
    )
    out.write_text(html, encoding="utf-8")
    return Built(out, crow)


def build_report(
    paths: list[str | Path],
    out: Path | None = None,
    title: str | None = None,
    *,
    claims: list[dict] | None = None,
    inputs: RecordSet | None = None,
) -> Path:
    """`make_report`, returning the HTML path only."""
    return make_report(paths, out, title, claims=claims, inputs=inputs).path
