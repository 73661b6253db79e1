"""The report's "How far to trust the predictions" section: the validation records among the report's inputs
(kind "validation", docs/records.md#validation-records: `python -m tspbench.validate out=PATH`, or the run flow's
tspbench.run.context) as a table of published vs predicted per row and quantity, the median / worst absolute error
per subset, and a predicted-vs-published scatter per quantity; given peer-estimate records (tspbench/peers), our
predictions beside llm-analysis's and DeepSpeed's (`peer_section`). Records only: nothing is predicted here, and no
file the report was not given is read."""

from __future__ import annotations

import statistics
from typing import Any

from markupsafe import Markup, escape

from tspbench.config import GIB_TO_GB

QUANTITIES: dict[str, tuple[str, float]] = {
    # record key -> (printed label, factor from the record's unit to the printed one: memory GiB -> GB)
    "tokens_per_s_per_gpu": ("tokens/s per GPU", 1.0),
    "mfu_pct": ("MFU (%)", 1.0),
    "peak_mem_gib": ("peak memory (GB)", GIB_TO_GB),
    "step_s": ("iteration time (s)", 1.0),
}
SUBSETS = ("calibration", "validation")
VALIDATE_COMMAND = "python -m tspbench.validate out=results/validation.jsonl"
"""The command that writes the records this section reads (named when the inputs hold none)."""


def latest_rows(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per published row (row_id), the last one read; order of first appearance."""
    by_id: dict[Any, dict[str, Any]] = {}
    for r in recs:
        by_id.pop(r.get("row_id"), None)
        by_id[r.get("row_id")] = r
    return list(by_id.values())


def _errors(recs: list[dict[str, Any]], subset: str, q: str, key: str = "error_pct") -> list[float]:
    return [abs(r[key][q]) for r in recs if r.get("subset") == subset and q in (r.get(key) or {})]


def _scatter(recs: list[dict[str, Any]]) -> str | None:
    from matplotlib.figure import Figure

    from tspbench.report.plot import encode  # matplotlib only when building

    qs = [q for q in QUANTITIES if any(q in (r.get("error_pct") or {}) for r in recs)]
    if not qs:
        return None
    fig = Figure(figsize=(4.2 * len(qs), 4.0), layout="constrained")
    for i, q in enumerate(qs):
        ax = fig.add_subplot(1, len(qs), i + 1)
        label, factor = QUANTITIES[q]
        top = 0.0
        for subset, marker in zip(SUBSETS, ("o", "s"), strict=True):
            pts = [
                (r["published"][q] * factor, r["predicted"][q] * factor)
                for r in recs
                if r.get("subset") == subset and q in (r.get("error_pct") or {})
            ]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.scatter(xs, ys, marker=marker, label=subset, alpha=0.8)
                top = max(top, *xs, *ys)
        ax.plot([0, top * 1.05], [0, top * 1.05], "k--", lw=0.8, label="exact")
        ax.set_xlabel(f"published {label}")
        ax.set_ylabel(f"predicted {label}")
        ax.legend(fontsize=8)
    return encode(fig)


def _summary(recs: list[dict[str, Any]], key: str = "error_pct", table: str = "trust-summary") -> list[str]:
    out = [
        f'<div class="scroll"><table id="{table}"><thead><tr><th>Subset</th><th>Quantity</th>'
        "<th>n</th><th>Median |error|</th><th>Worst |error|</th></tr></thead><tbody>"
    ]
    for subset in SUBSETS:
        for q, (label, _) in QUANTITIES.items():
            errs = _errors(recs, subset, q, key)
            if errs:
                out.append(
                    f"<tr><td>{subset}</td><td>{label}</td><td>{len(errs)}</td>"
                    f"<td>{statistics.median(errs):.1f}%</td><td>{max(errs):.1f}%</td></tr>"
                )
    out.append("</tbody></table></div>")
    return out


def _row(r: dict[str, Any], cells: str) -> str:
    return (
        f"<tr><td>{escape(r.get('row_id', ''))}</td><td>{escape(r.get('subset', ''))}</td>"
        f"<td>{escape(r.get('hardware', ''))}</td>{cells}<td>{escape(r.get('source', ''))}</td></tr>"
    )


def _rows(recs: list[dict[str, Any]]) -> list[str]:
    out = [
        '<div class="scroll"><table id="trust-table"><thead><tr><th>Row</th><th>Subset</th><th>Hardware'
        "</th><th>Quantity</th><th>Published</th><th>Predicted</th><th>Error</th><th>Source</th></tr>"
        "</thead><tbody>"
    ]
    for r in recs:
        if r.get("status") in ("out_of_scope", "implausible"):
            why = r.get("out_of_scope") if r.get("status") == "out_of_scope" else r.get("reason")
            status = str(r.get("status")).replace("_", " ")
            out.append(_row(r, f'<td colspan="4">{status}: {escape(why or "")}</td>'))
            continue
        for q, pub in (r.get("published") or {}).items():
            label, factor = QUANTITIES.get(q, (q, 1.0))
            err = (r.get("error_pct") or {}).get(q)
            pred = (r.get("predicted") or {}).get(q)
            why = (r.get("quantity_out_of_scope") or {}).get(q) or ""
            cell = f"{err:+.1f}%" if err is not None else escape(why)
            pred_s = f"{pred * factor:.4g}" if isinstance(pred, (int, float)) else "—"
            out.append(_row(r, f"<td>{label}</td><td>{pub * factor:.4g}</td><td>{pred_s}</td><td>{cell}</td>"))
    out.append("</tbody></table></div>")
    return out


def _moves(verdicts: list[dict[str, Any]]) -> list[str]:
    """Per claim the verdict answers, which uncertain input moves it most (from the verdict records)."""
    out = []
    for v in verdicts:
        if v.get("status") != "ok":
            continue
        out.append(
            '<p class="moves" id="trust-moves">The throughput claims (TSP against the strongest baseline, '
            f"{escape(str(v.get('setting', '')))}): {escape(str(v.get('moves_most', '')))}; its band over every "
            f"input is {v['ratio_low']:.2f}–{v['ratio_high']:.2f} (docs/method.md#verdict). The memory claims are "
            "compared as allocated peaks; the paper does not say which memory it reports. Read as the caching "
            "allocator's reserved peaks, every scheme's would be higher by the same factor (1.10 a priori; the one "
            "fitted on torchtitan's reserved peaks is printed by python -m tspbench.validate, "
            "docs/method.md#allocator), so the ratios between schemes do not move, while a claim's absolute GB "
            "does.</p>"
        )
    return out


PEER_LABELS: dict[str, tuple[str, float]] = {
    "tokens_per_s_per_gpu": ("tokens/s per GPU", 1.0),
    "step_s": ("iteration time (s)", 1.0),
    "peak_mem_gib": ("peak memory (GB)", GIB_TO_GB),
    "model_states_gib": ("model states (GB)", GIB_TO_GB),
}
"""Peer-estimate record quantity -> (label, factor from GiB to the printed GB)."""


def _peer_cell(v: Any, factor: float) -> str:
    return f"{v * factor:.4g}" if isinstance(v, (int, float)) and not isinstance(v, bool) else "—"


def peer_section(peers: list[dict[str, Any]]) -> list[str]:
    """The peer-estimator subsection (docs/method.md#peers) from peer-estimate records (kind "peer_estimate",
    tspbench/peers/estimators.py): ours beside llm-analysis's and DeepSpeed's ZeRO-3 estimates, the published value
    and why they differ; nothing without such records (`python -m tspbench.validate` prints the same table)."""
    if not peers:
        return []  # the section's one "no data" line stays the validation records'
    out = [
        '<h3 id="trust-peers">Beside the peers\' estimators</h3>',
        "<p>Our cost model next to llm-analysis's estimate and DeepSpeed's ZeRO-3 model-state estimator on the same "
        "configurations (docs/method.md#peers); memory in GB.</p>",
    ]
    out.append(
        '<div class="scroll"><table id="trust-peers-table"><thead><tr><th>Row</th><th>Quantity</th><th>Ours</th>'
        "<th>llm-analysis</th><th>DeepSpeed</th><th>Published</th><th>Why they differ</th></tr></thead><tbody>"
    )
    for r in peers:
        label, f = PEER_LABELS.get(str(r.get("quantity")), (str(r.get("quantity")), 1.0))
        cells = "".join(
            f"<td>{_peer_cell(r.get(k), f)}</td>" for k in ("ours", "llm_analysis", "deepspeed", "published")
        )
        out.append(
            f"<tr><td>{escape(r.get('case', ''))}</td><td>{escape(label)}</td>{cells}"
            f"<td>{escape(r.get('why', ''))}</td></tr>"
        )
    out.append("</tbody></table></div>")
    return out


def trust_section(
    recs: list[dict[str, Any]],
    verdicts: list[dict[str, Any]] | None = None,
    peers: list[dict[str, Any]] | None = None,
) -> Markup:
    """The section's HTML from validation records (and, per claim, what moves it most from the verdict records; the
    peer estimators beside ours from peer-estimate records); without validation records, one line naming the
    command that writes them."""
    out = ['<h2 id="trust">How far to trust the predictions</h2>', *_moves(verdicts or [])]
    recs = latest_rows(recs)
    if not recs:
        out.append(
            f'<p class="nodata" id="trust-none">No validation records among the report\'s inputs: '
            f"<code>{VALIDATE_COMMAND}</code> writes them.</p>"
        )
        out += peer_section(peers or [])
        return Markup("\n".join(out))
    plausible = [r for r in recs if r.get("status") != "implausible"]
    out.append(
        "<p>The closed-form cost model (time: α–β + roofline with the profiles' sourced efficiencies, the measured "
        "GEMM ceilings and the published attention figures, nothing fitted) against third-party published measurements "
        "(conf/published). Error = (predicted − published) / published; memory in GB. The calibration/validation "
        "split is fixed in the data file.</p>"
    )
    out += _summary(plausible)
    if any(r.get("fitted_error_pct") for r in plausible):
        out.append(
            '<p id="trust-fitted-note">The same rows, each under its implementation stack\'s two kernel constants '
            "fitted on calibration rows only (tspbench/predict/fit.py; calibration: the fit's residuals, validation: "
            "held-out errors; each row's throughput as it publishes it: tokens/s, else MFU, else iteration time). "
            "The verdicts keep the a-priori constants.</p>"
        )
        out += _summary(plausible, "fitted_error_pct", "trust-fitted")
    out += _rows(recs)
    img = _scatter(plausible)
    if img:
        out.append(
            '<figure id="fig-trust"><strong>Predicted vs published</strong>'
            f'<img id="fig-trust-img" src="{img}" alt="predicted vs published">'
            "<figcaption>Each published number against the cost model's prediction; dashed: exact.</figcaption>"
            "</figure>"
        )
    out += peer_section(peers or [])
    return Markup("\n".join(out))
