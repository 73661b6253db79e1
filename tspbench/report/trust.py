"""The report's "How far to trust the predictions" section (issue 13 §1): the validation records that
`python -m tspbench.validate` wrote (kind "validation", docs/records.md#validation-records) as a table of
published vs predicted per row and quantity, the median / worst absolute error per subset, and a
predicted-vs-published scatter per quantity. Reads them from the report's inputs, else from
results/validation.jsonl."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from markupsafe import Markup, escape

from tspbench.paths import results_dir
from tspbench.record.store import read_records

LABELS = {
    "tokens_per_s_per_gpu": "tokens/s per GPU",
    "mfu_pct": "MFU (%)",
    "peak_mem_gib": "peak memory (GiB)",
    "step_s": "iteration time (s)",
}
SUBSETS = ("calibration", "validation")


def validation_records(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    recs = read_records(list(paths), kind="validation")
    if not recs:
        recs = read_records([results_dir() / "validation.jsonl"], kind="validation")
    return recs


def _scatter(recs: list[dict[str, Any]]) -> str | None:
    from tspbench.report.figures import encode  # matplotlib only when building

    qs = [q for q in LABELS if any(q in r.get("error_pct", {}) for r in recs)]
    if not qs:
        return None
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(qs), figsize=(4.2 * len(qs), 4.0), squeeze=False)
    for ax, q in zip(axes[0], qs, strict=True):
        top = 0.0
        for subset, marker in zip(SUBSETS, ("o", "s"), strict=True):
            pts = [
                (r["published"][q], r["predicted"][q])
                for r in recs
                if r["subset"] == subset and q in r.get("error_pct", {})
            ]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.scatter(xs, ys, marker=marker, label=subset, alpha=0.8)
                top = max(top, *xs, *ys)
        ax.plot([0, top * 1.05], [0, top * 1.05], "k--", lw=0.8, label="exact")
        ax.set_xlabel(f"published {LABELS[q]}")
        ax.set_ylabel(f"predicted {LABELS[q]}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    src = encode(fig)
    plt.close(fig)
    return src


def trust_section(paths: Iterable[str | Path]) -> Markup:
    """The section's HTML (empty-data note when no validation records exist)."""
    recs = validation_records(paths)
    out = ['<h2 id="trust">How far to trust the predictions</h2>']
    if not recs:
        out.append('<p class="nodata">No validation records: run <code>python -m tspbench.validate</code>.</p>')
        return Markup("\n".join(out))
    out.append(
        "<p>The closed-form cost model (time: α–β + roofline with the profiles' assumed efficiencies, nothing "
        "fitted) against third-party published measurements (conf/published). Error = (predicted − published) "
        "/ published. The calibration/validation split is fixed in the data file.</p>"
    )
    out.append(
        '<div class="scroll"><table id="trust-summary"><thead><tr><th>Subset</th><th>Quantity</th>'
        "<th>n</th><th>Median |error|</th><th>Worst |error|</th></tr></thead><tbody>"
    )
    for subset in SUBSETS:
        for q, label in LABELS.items():
            errs = [abs(r["error_pct"][q]) for r in recs if r["subset"] == subset and q in r.get("error_pct", {})]
            if errs:
                out.append(
                    f"<tr><td>{subset}</td><td>{label}</td><td>{len(errs)}</td>"
                    f"<td>{statistics.median(errs):.1f}%</td><td>{max(errs):.1f}%</td></tr>"
                )
    out.append("</tbody></table></div>")
    out.append(
        '<div class="scroll"><table id="trust-table"><thead><tr><th>Row</th><th>Subset</th><th>Hardware'
        "</th><th>Quantity</th><th>Published</th><th>Predicted</th><th>Error</th><th>Source</th></tr>"
        "</thead><tbody>"
    )
    for r in recs:
        src = escape(r.get("source", ""))
        if r.get("status") == "out_of_scope":
            out.append(
                f"<tr><td>{escape(r['row_id'])}</td><td>{r['subset']}</td><td>{escape(r['hardware'])}</td>"
                f'<td colspan="4">out of scope: {escape(r.get("out_of_scope") or "")}</td><td>{src}</td></tr>'
            )
            continue
        for q, pub in r.get("published", {}).items():
            err = r.get("error_pct", {}).get(q)
            pred = r.get("predicted", {}).get(q)
            cell = f"{err:+.1f}%" if err is not None else escape(r.get("quantity_out_of_scope", {}).get(q) or "")
            pred_s = f"{pred:.4g}" if isinstance(pred, (int, float)) else "—"
            out.append(
                f"<tr><td>{escape(r['row_id'])}</td><td>{r['subset']}</td><td>{escape(r['hardware'])}</td>"
                f"<td>{LABELS.get(q, q)}</td><td>{pub:.4g}</td><td>{pred_s}</td><td>{cell}</td><td>{src}</td></tr>"
            )
    out.append("</tbody></table></div>")
    img = _scatter(recs)
    if img:
        out.append(
            '<figure id="fig-trust"><strong>Predicted vs published</strong>'
            f'<img id="fig-trust-img" src="{img}" alt="predicted vs published">'
            "<figcaption>Each published number against the cost model's prediction; dashed: exact.</figcaption>"
            "</figure>"
        )
    return Markup("\n".join(out))
