"""Result records -> tables -> one self-contained HTML file (+ CSV and Markdown beside it).

The report reads JSONL records only (never logs). Flow:

    read_records -> de-duplicate by run_id (last wins) -> flat rows (metrics un-nested, derived fields)
    -> claims-vs-ours table, per-scheme summary, failures, provenance  (this file)
    -> figures (figures.py, inline SVG data: URIs) -> templates/report.html.j2

Every derived number says what it was derived from (e.g. "peak reserved GiB x 1.0737 -> GB"), because
records mix measured GPU runs, CPU (gloo) runs and estimated/modelled predictions.
"""
from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path
from typing import Any, Iterable

import pandas as pd
from jinja2 import Environment, FileSystemLoader, select_autoescape

from tspbench.results import read_records

REPORTS_DIR = Path(__file__).resolve().parents[2] / "reports"
GIB_TO_GB = 1.073741824  # 1 GiB = 2**30 B = 1.073741824 GB; the paper quotes GB
WITHIN_PCT = 10.0
CPU_NOTE = "CPU (gloo): checks the machinery, not GPU performance"
NOT_REPRODUCED = "not reproduced by these results"

SCHEME_ORDER = ("single", "tp", "tp_msp", "sp", "tp_sp", "tsp")
# "SP" is spelled out everywhere: the paper's SP is token sharding (= CP), not Megatron-SP (method §7).
SCHEME_NAMES = {"single": "single device", "tp": "TP", "tp_msp": "TP + Megatron-SP",
                "sp": "SP (token sharding / CP)", "tp_sp": "TP×SP", "tsp": "TSP"}
METHOD_ORDER = ("measured", "estimated", "modelled")
# Device memory in GB (vendor figures) for the capacity line; a record's device_capacity_gib wins.
CAPACITY_GB = {"mi300x": 192.0, "h200": 141.0, "h100": 80.0}
NUMERIC = ("seq_len", "degree", "tp_degree", "sp_degree", "dp", "world_size", "nodes", "batch",
           "tokens_per_s", "tokens_per_s_per_device", "predicted_tokens_per_s", "mem_total_gib",
           "peak_allocated_gib", "peak_reserved_gib", "energy_j_per_token", "compute_ms",
           "exposed_comm_ms", "comm_bytes_per_layer_fwd", "comm_bytes_per_layer_bwd",
           "mfu_causal_pct", "mfu_noncausal_pct", "device_capacity_gib")
MEM_PARTS = (("mem_params_gib", "params"), ("mem_grads_gib", "grads"),
             ("mem_optimizer_gib", "optimizer"), ("mem_activations_gib", "activations"),
             ("mem_temporaries_gib", "temporaries"), ("mem_comm_buffers_gib", "comm buffers"))


# ---------------------------------------------------------------- loading -------------------------

def num(x: Any) -> float | None:
    """A finite float, or None (records use null for "not available"; NaN/strings count as missing)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def dedupe(records: Iterable[dict]) -> list[dict]:
    """Keep the last record per run_id (a re-run or a later file supersedes); keep id-less records."""
    by_id: dict[Any, int] = {}
    out: list[dict] = []
    for r in records:
        if not isinstance(r, dict):
            continue
        rid = r.get("run_id")
        if rid is not None and rid in by_id:
            out[by_id[rid]] = None  # type: ignore[call-overload]  # drop the earlier one, keep order
        if rid is not None:
            by_id[rid] = len(out)
        out.append(r)
    return [r for r in out if r is not None]


def scheme_label(row: dict) -> str:
    """Scheme plus its layout, e.g. "TSP D=8", "TP×SP T=4·Σ=2" (paper notation, method §2)."""
    s, d = row.get("scheme"), num(row.get("degree"))
    name = SCHEME_NAMES.get(s, str(s or "?"))
    di = "" if d is None else str(int(d))
    if s in ("tp", "tp_msp"):
        lay = f"T={di}"
    elif s == "sp":
        lay = f"Σ={di}" + (f" {row['sp_variant']}" if row.get("sp_variant") == "ring" else "")
    elif s == "tp_sp":
        t, sp = num(row.get("tp_degree")), num(row.get("sp_degree"))
        lay = f"T={int(t)}·Σ={int(sp)}" if t and sp else f"T·Σ={di}"
    elif s == "tsp":
        lay = f"D={di}"
    else:
        lay = ""
    return f"{name} {lay}".strip() if di or s == "tp_sp" else name


def hardware_label(row: dict) -> str:
    """Where a number comes from: the device for measured runs, the hardware profile otherwise."""
    if row.get("method") in ("estimated", "modelled"):
        return str(row.get("hardware") or "unknown hardware")
    if row.get("device") == "cpu":
        return "CPU (gloo)"
    return str(row.get("device_name") or row.get("hardware") or row.get("device") or "unknown device")


def capacity_gib(row: dict) -> float | None:
    if num(row.get("device_capacity_gib")):
        return num(row.get("device_capacity_gib"))
    name = f"{row.get('hardware') or ''} {row.get('device_name') or ''}".lower().replace(" ", "")
    for key, gb in CAPACITY_GB.items():
        if key in name:
            return gb / GIB_TO_GB
    return None


def peak_memory(row: dict) -> tuple[float | None, str]:
    """Peak memory per device in GiB and what it is. Measured runs: reserved (what the device must
    hold), else allocated, else the MemTracker total (CPU has no allocator peaks); estimated and
    modelled runs: the predicted peak mem_total_gib."""
    order = (("peak_reserved_gib", "peak reserved"), ("peak_allocated_gib", "peak allocated"),
             ("mem_total_gib", "tracked total"), ("device_used_gib", "device used"))
    if row.get("method") in ("estimated", "modelled"):
        order = (("mem_total_gib", "predicted peak"), order[0], order[1])
    for key, what in order:
        if num(row.get(key)) is not None:
            return num(row[key]), what
    return None, ""


def flatten(rec: dict) -> dict:
    """One flat row: top-level scalars, metrics un-nested, model_cfg.* -> cfg_*, per_rank.* ->
    rank_*, provenance kept whole; then the derived fields every table and figure uses."""
    def sub(key: str) -> dict:  # a nested block, or {} when missing/null/malformed
        return rec.get(key) if isinstance(rec.get(key), dict) else {}

    row = {k: v for k, v in rec.items() if not isinstance(v, dict)}
    for k, v in sub("metrics").items():
        row.setdefault(k, v)  # a metric never overrides a top-level key of the same name
    row.update({f"cfg_{k}": v for k, v in sub("model_cfg").items()})
    row.update({f"rank_{k}": v for k, v in sub("per_rank").items()})
    row["provenance"] = sub("provenance")
    row["status"] = row.get("status") or "unknown"
    row["method"] = row.get("method") or "unknown"
    row["label"] = scheme_label(row)
    row["hw"] = hardware_label(row)
    row["is_cpu"] = row["hw"] == "CPU (gloo)"
    # Panels group by model, hardware *profile* and mode, so a measured H100 run and a modelled "h100"
    # prediction share one panel even though their labels differ, while a training step, a forward and a
    # decode step (different work per token) never share a line.
    where = row["hw"] if row["is_cpu"] else (row.get("hardware") or row["hw"])
    row["ctx"] = f"{row.get('model') or 'model?'} · {where} · {row.get('mode') or 'mode?'}"
    ws = num(row.get("world_size")) or num(row.get("degree"))
    tok = num(row.get("tokens_per_s"))
    row["tok_basis"] = "tokens_per_s" if tok is not None else ""
    if tok is None and num(row.get("predicted_tokens_per_s")) is not None:
        tok, row["tok_basis"] = num(row["predicted_tokens_per_s"]), "predicted_tokens_per_s"
    row["tok"] = tok
    row["tok_dev"] = num(row.get("tokens_per_s_per_device"))
    if row["tok_dev"] is None and tok is not None and ws:
        row["tok_dev"] = tok / ws
    # Step time over ranks: the record's summary, else computed from the per-rank list.
    ranks = row.get("rank_step_time_ms")
    ranks = [v for v in map(num, ranks if isinstance(ranks, list) else []) if v is not None]
    for key, metric, fn in (("step_min", "step_time_ms_min", min),
                            ("step_p50", "step_time_ms_p50", statistics.median),
                            ("step_max", "step_time_ms_max", max)):
        v = num(row.get(metric))
        row[key] = v if v is not None else (fn(ranks) if ranks else None)
    row["mem_gib"], row["mem_basis"] = peak_memory(row)
    row["capacity_gib"] = capacity_gib(row)
    return row


def records(df: pd.DataFrame) -> list[dict]:
    """DataFrame rows as dicts with pandas' NaN turned back into None (the records' "missing")."""
    if df.empty:
        return []
    return [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
            for r in df.to_dict("records")]


def load_frame(paths: Iterable[str | Path]) -> tuple[pd.DataFrame, int]:
    """(one row per de-duplicated record, number of raw records read)."""
    raw = read_records(paths)
    rows = [flatten(r) for r in dedupe(raw)]
    df = pd.DataFrame(rows)
    for col in ("run_id", "scheme", "seq_len", "degree", "tp_degree", "sp_degree", "world_size",
                "batch", "mode", "model", "reason", "device", "device_name", "hardware"):
        if col not in df:
            df[col] = None
    # Numbers written as strings (or garbage) by another tool become numbers (or NaN) here, once.
    for col in NUMERIC:
        if col in df:
            df[col] = pd.to_numeric(df[col], errors="coerce")
    if not df.empty:
        # Sort on clean keys: records from other runs may carry strings where numbers are expected.
        keys = pd.DataFrame({
            "scheme": df["scheme"].map({s: i for i, s in enumerate(SCHEME_ORDER)}).fillna(99),
            **{c: pd.to_numeric(df[c], errors="coerce") for c in ("degree", "tp_degree")},
            **{c: df[c].astype(str) for c in ("model", "ctx", "method")},
            "seq_len": pd.to_numeric(df["seq_len"], errors="coerce")})
        order = keys.sort_values(list(keys.columns), kind="stable", na_position="last").index
        df = df.loc[order].reset_index(drop=True)
    return df, len(raw)


# ---------------------------------------------------------------- claims --------------------------

def load_claim_list() -> tuple[list[dict], str]:
    """Claims from tspbench.claims (written separately); an empty list if it is not there yet."""
    try:
        from tspbench.claims import load_claims  # lazy: the module may not exist yet
        return list(load_claims()), "tspbench.claims"
    except Exception as e:  # noqa: BLE001 - any failure means "no claims", reported in the page
        return [], f"no claims loaded ({type(e).__name__}: {e})"


def _same(a: Any, b: Any) -> bool:
    na, nb = num(a), num(b)
    return na == nb if na is not None and nb is not None else a == b


def _layout(r: dict) -> tuple[Any, Any]:
    """(T, Σ) of a record, filling the ones its scheme implies when the record leaves them out."""
    d = r.get("degree")
    implied = {"single": (1, 1), "tp": (d, 1), "tp_msp": (d, 1), "sp": (1, d)}.get(r.get("scheme"),
                                                                                    (None, None))
    return (r.get("tp_degree") if r.get("tp_degree") is not None else implied[0],
            r.get("sp_degree") if r.get("sp_degree") is not None else implied[1])


def _matches(claim: dict, r: dict, scheme: str | None) -> bool:
    """Does a record answer a claim? Same scheme and sequence length, plus the layout, GPU count,
    model and mode wherever the claim states one."""
    tp, sp = _layout(r)
    have_scheme = r.get("scheme")
    if scheme == "tp_sp" and have_scheme == "sp":  # pure SP is the T = 1 × Σ factorisation (A3: report all)
        have_scheme = "tp_sp"
    checks = [(scheme, have_scheme), (claim.get("seq_len"), r.get("seq_len")),
              (claim.get("degree"), r.get("degree")), (claim.get("tp"), tp), (claim.get("sp"), sp),
              (claim.get("model"), r.get("model")), (claim.get("mode"), r.get("mode"))]
    if claim.get("unit") != "GB":  # throughput is cluster-wide: compare at the same GPU count only
        checks.append((claim.get("n_gpus"), r.get("world_size")))
    return all(want is None or _same(have, want) for want, have in checks)


def _latest_per_group(rows: list[dict]) -> list[dict]:
    """One record per (method, hardware, model, layout, batch, mode): the last one written."""
    last: dict[tuple, dict] = {}
    for r in rows:
        last[tuple(str(r.get(k)) for k in ("method", "hw", "model", "degree", "tp_degree",
                                           "sp_degree", "batch", "mode"))] = r
    order = {m: i for i, m in enumerate(METHOD_ORDER)}
    return sorted(last.values(), key=lambda r: (order.get(r["method"], 9), r["label"]))


def _values(claim: dict, r: dict, rows: list[dict]) -> list[tuple[float, str]]:
    """Our number(s) for one claim from one record, in the claim's unit, each with how it was got."""
    unit = claim.get("unit")
    if unit == "GB" and r["mem_gib"] is not None:
        return [(r["mem_gib"] * GIB_TO_GB, f"{r['mem_basis']} GiB × {GIB_TO_GB} → GB")]
    if unit == "tokens/s" and r["tok"] is not None:
        return [(r["tok"], r["tok_basis"])]
    if unit == "x" and r["tok"]:
        # A speed-up over a baseline the claim does not pin down: report TSP against every baseline
        # layout run in the same setting (method §6.4), strongest baseline first.
        base = claim.get("baseline") or "tp_sp"
        same = [b for b in rows if b.get("scheme") == base and b["status"] == "ok" and b["tok"]
                and all(_same(b.get(k), r.get(k)) for k in ("seq_len", "world_size", "model",
                                                             "batch", "mode", "method", "hw"))]
        same = sorted(_latest_per_group(same), key=lambda b: -b["tok"])
        return [(r["tok"] / b["tok"], f"{r['tok_basis']} ÷ that of {b['label']} ({b.get('run_id')})")
                for b in same]
    return []


def describe_claim(c: dict) -> str:
    """A readable name for a claim, e.g. "TSP D=8 memory, S=128K, 8 GPUs (mi300x)"."""
    kind = {"ratio": "speed-up"}.get(c.get("kind"), c.get("kind")) or {
        "GB": "memory", "tokens/s": "throughput", "x": "speed-up"}.get(c.get("unit"), "")
    what = scheme_label({"scheme": c.get("scheme"), "degree": c.get("degree"),
                         "tp_degree": c.get("tp"), "sp_degree": c.get("sp")})
    gpus = f", {int(num(c['n_gpus']))} GPUs" if num(c.get("n_gpus")) else ""
    hw = f" ({c['hardware']})" if c.get("hardware") else ""
    return f"{what} {kind}, S={fmt_seq(c.get('seq_len'))}{gpus}{hw}"


def claims_table(claims: list[dict], df: pd.DataFrame) -> list[dict]:
    """Rows of the claimed-vs-reproduced table: one per (claim, matching run group[, baseline]), or
    one "not reproduced" row for a claim nothing answers."""
    rows = records(df)
    out = []
    for c in claims:
        base = {"id": c.get("id"), "claim": describe_claim(c), "tag": c.get("label") or "",
                "scheme": c.get("scheme"), "seq_len": c.get("seq_len"), "n_gpus": c.get("n_gpus"),
                "claimed": num(c.get("value")), "unit": c.get("unit"), "source": c.get("source"),
                "ref": c.get("doc_ref") or c.get("source") or "",
                "claim_note": " · ".join(str(c[k]) for k in ("note", "source") if c.get(k))}
        matches = [r for r in rows if _matches(c, r, c.get("scheme"))]
        found = False
        for r in _latest_per_group([r for r in matches if r["status"] == "ok"]):
            # The paper's model has h = 4096 (method §6.1); a smaller model's number is shown but
            # flagged and never counted as agreeing.
            h = num(r.get("cfg_dim"))
            ref = h is None or h == 4096
            for ours, basis in _values(c, r, rows):
                found = True
                dev = (ours - base["claimed"]) / base["claimed"] * 100 if base["claimed"] else None
                out.append({**base, "ours": ours, "deviation_pct": dev,
                            "within": ref and dev is not None and abs(dev) <= WITHIN_PCT,
                            "method": r["method"], "hardware": r["hw"], "is_cpu": r["is_cpu"],
                            "layout": r["label"], "model": r.get("model"), "run_id": r.get("run_id"),
                            "basis": basis + ("" if ref else f"; model h={h:g}, not the paper's 4096")})
        if not found:
            bad = sorted({r["status"] for r in matches if r["status"] != "ok"})
            why = NOT_REPRODUCED + (f" (matching runs: {', '.join(bad)})" if bad else "")
            out.append({**base, "ours": None, "deviation_pct": None, "within": False,
                        "method": None, "hardware": None, "is_cpu": False, "layout": None,
                        "model": None, "basis": why, "run_id": None})
    return out


def evidence_line(claims: list[dict], rows: list[dict], claims_source: str) -> str:
    """One sentence on what the evidence supports, generated from the table."""
    if not claims:
        return f"No paper claims to compare ({claims_source})."
    got = [r for r in rows if r["ours"] is not None]
    matched = {r["id"] for r in got}
    within = {r["id"] for r in got if r["within"]}
    gpu = {r["id"] for r in got if r["method"] == "measured" and not r["is_cpu"]}
    per_method = ", ".join(f"{sum(r['method'] == m for r in got)} {m}" for m in METHOD_ORDER
                           if any(r["method"] == m for r in got))
    s = (f"{len(matched)} of {len(claims)} paper claims have a number in these results"
         + (f" ({per_method} rows)" if per_method else "")
         + f"; {len(within)} agree within ±{WITHIN_PCT:g}% in at least one row.")
    if matched and not gpu:
        s += (" None of these is a GPU measurement: estimated and modelled numbers are predictions "
              "for the named hardware, and CPU (gloo) runs check the machinery, not GPU performance.")
    elif matched - gpu:
        s += (f" Only {len(gpu)} claim(s) rest on GPU measurements; the rest are CPU, estimated or "
              "modelled numbers, which are not GPU measurements.")
    return s


# ---------------------------------------------------------------- other tables --------------------

def fmt(x: Any, digits: int = 2) -> str:
    """Compact number: "—" when missing, SI suffix from 10k up (173M, 12.3k), else `digits` decimals."""
    v = num(x)
    if v is None:
        return "—"
    for div, suf in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= max(div, 1e4):
            return f"{v / div:.3g}{suf}"
    return f"{v:.{digits}f}" if abs(v) < 100 else f"{v:.0f}"


def fmt_seq(x: Any) -> str:
    v = num(x)
    if v is None:
        return "—"
    return f"{int(v) // 1024}K" if v >= 1024 and int(v) % 1024 == 0 else str(int(v))


def summary_rows(df: pd.DataFrame) -> list[dict]:
    """Per-scheme summary: one row per run, already sorted by scheme / layout / sequence length."""
    out = []
    for r in records(df):
        parts = [f"{short} {fmt(r.get(k))}" for k, short in MEM_PARTS if num(r.get(k)) is not None]
        alloc, res = num(r.get("peak_allocated_gib")), num(r.get("peak_reserved_gib"))
        peak = (f"{fmt(alloc)} / {fmt(res)}" if alloc is not None or res is not None else
                (f"{fmt(r['mem_gib'])} ({r['mem_basis']})" if r["mem_gib"] is not None else "—"))
        out.append({
            "label": r["label"], "seq": fmt_seq(r.get("seq_len")), "batch": fmt(r.get("batch"), 0),
            "mode": r.get("mode") or "—", "model": r.get("model") or "—",
            "method": r["method"], "hw": r["hw"], "is_cpu": r["is_cpu"],
            "tok": fmt(r["tok"], 3), "tok_dev": fmt(r["tok_dev"], 3),
            "tok_pred": r["tok_basis"] == "predicted_tokens_per_s",
            "mfu": f"{fmt(r.get('mfu_causal_pct'), 1)} / {fmt(r.get('mfu_noncausal_pct'), 1)}",
            "step": f"{fmt(r['step_min'], 1)} / {fmt(r['step_p50'], 1)} / {fmt(r['step_max'], 1)}",
            "peak": peak, "breakdown": ", ".join(parts) or "—",
            "j_tok": fmt(r.get("energy_j_per_token"), 3),
            "j_tok_why": r.get("energy_reason") or "", "status": r["status"],
        })
    return out


def failure_rows(df: pd.DataFrame) -> list[dict]:
    if df.empty:
        return []
    bad = df[df["status"] != "ok"]
    return [{"run_id": r.get("run_id") or "—", "label": r["label"], "seq": fmt_seq(r.get("seq_len")),
             "method": r["method"], "hw": r["hw"], "status": r["status"],
             # A log tail can be long; its end is where the error is.
             "reason": (str(r.get("reason"))[-1500:] if r.get("reason") not in (None, "") else
                        "no reason recorded")}
            for r in records(bad)]


def provenance_rows(df: pd.DataFrame) -> tuple[list[dict], list[dict]]:
    """(one row per run, one entry per distinct resolved config with the runs that used it)."""
    runs, configs = [], {}
    for r in records(df):
        p = r["provenance"] or {}
        commit = str(p.get("git_commit") or "—")[:12] + (" (dirty)" if p.get("git_dirty") else "")
        runs.append({"run_id": r.get("run_id") or "—", "commit": commit,
                     "versions": " · ".join(f"{k} {p[k]}" for k in ("torch", "nccl", "driver")
                                            if p.get(k)) or "—",
                     "host": p.get("hostname") or "—",
                     "devices": ", ".join(map(str, p.get("device_names") or [])) or r["hw"],
                     "seed": p.get("seed", "—"),
                     "steps": f"{p.get('warmup_steps', '—')} + {p.get('measured_steps', '—')}",
                     "when": f"{p.get('started_at') or '—'} → {p.get('finished_at') or '—'}"})
        if p.get("config") is not None:
            text = json.dumps(p["config"], indent=2, sort_keys=True, default=str)
            configs.setdefault(text, []).append(str(r.get("run_id")))
    return runs, [{"runs": ", ".join(ids), "text": t} for t, ids in configs.items()]


# ---------------------------------------------------------------- exports and rendering -----------

CSV_COLUMNS = ("id", "claim", "tag", "scheme", "seq_len", "n_gpus", "claimed", "unit", "ours",
               "deviation_pct", "within", "method", "hardware", "layout", "model", "basis",
               "run_id", "source")


def write_exports(rows: list[dict], csv_path: Path, md_path: Path) -> None:
    table = pd.DataFrame(rows, columns=list(CSV_COLUMNS))
    table.to_csv(csv_path, index=False)
    head = ["claim", "paper", "ours", "deviation", "method", "hardware", "layout", "basis"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["claim"], f"{fmt(r['claimed'])} {r['unit']}",
                 f"{fmt(r['ours'])} {r['unit']}" if r["ours"] is not None else "—",
                 f"{r['deviation_pct']:+.1f}%" if r["deviation_pct"] is not None else "—",
                 r["method"] or "—", r["hardware"] or "—", r["layout"] or "—", r["basis"]]
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    md_path.write_text("\n".join(lines) + "\n")


def build_report(paths: list[str | Path], out: Path | None = None, title: str | None = None,
                 *, claims: list[dict] | None = None) -> Path:
    """Build the HTML report from JSONL files/directories; returns the HTML path. Writes
    `<stem>.csv` and `<stem>.md` (claimed vs reproduced) beside it. `claims` overrides
    tspbench.claims (tests use it)."""
    from tspbench.report.figures import make_figures  # matplotlib import is slow; only when building

    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(out) if out is not None else REPORTS_DIR / f"report-{stamp}.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out.with_suffix(".csv"), out.with_suffix(".md")

    df, n_raw = load_frame(paths)
    claims_source = "given by caller"
    if claims is None:
        claims, claims_source = load_claim_list()
    crow = claims_table(claims, df)
    write_exports(crow, csv_path, md_path)
    runs, configs = provenance_rows(df)

    env = Environment(loader=FileSystemLoader(Path(__file__).parent / "templates"),
                      autoescape=select_autoescape(["html", "j2"]), trim_blocks=True,
                      lstrip_blocks=True)
    env.filters.update(fmt=fmt, fmt_seq=fmt_seq)
    html = env.get_template("report.html.j2").render(
        title=title or "tspbench report: TSP claims vs these results",
        generated=time.strftime("%Y-%m-%d %H:%M:%S %Z"), sources=[str(p) for p in paths],
        n_raw=n_raw, n_runs=len(df), claims_source=claims_source, claims=crow,
        evidence=evidence_line(claims, crow, claims_source), within_pct=WITHIN_PCT,
        any_cpu=bool(not df.empty and df["is_cpu"].any()), cpu_note=CPU_NOTE,
        summary=summary_rows(df), figures=make_figures(df), failures=failure_rows(df),
        runs=runs, configs=configs, csv_name=csv_path.name, md_name=md_path.name)
    out.write_text(html, encoding="utf-8")
    return out
