"""`python -m tspbench.validate [out=PATH] [FILE ...]`: the cost model against published third-party measurements.

The command line only: the rows of conf/published/*.yaml (or the files given) are predicted by
tspbench/predict/published.py (the cost model on each row's hardware profile; how each quantity is predicted is
described there). Prints predicted vs published with the signed error per row, then the median and worst absolute
error per quantity, separately for the calibration and validation subsets, memory in GB; writes one validation
record per row (docs/records.md#validation-records) through tspbench.record.store.write_records (atomic, each record
guarded).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from tspbench import cli
from tspbench.config import GIB_TO_GB, ConfigError, Output
from tspbench.predict.costmodel.memory import ALLOCATOR_RESERVE
from tspbench.predict.fit import ReserveFit, annotate_fitted, fit_reserve, fit_summaries, fits, fitted_validation
from tspbench.predict.published import LONG_SEQ, default_files, load_rows, record, summary
from tspbench.record.store import write_records

PRINTED = {"peak_mem_gib": ("peak_mem_gb", GIB_TO_GB)}
"""Quantities printed in another unit than the record's: memory is stored in GiB and printed in GB."""


def render(
    records: list[dict[str, Any]],
    fits: list[dict[str, Any]] | None = None,
    reserve: ReserveFit | None = None,
    overall: dict[str, Any] | None = None,
) -> str:
    lines = [f"{'row':34s} {'subset':11s} {'quantity':21s} {'published':>10s} {'predicted':>10s} {'error':>8s}"]
    for r in records:
        if r["status"] == "out_of_scope":
            lines.append(f"{r['row_id']:34s} {r['subset']:11s} out of scope: {r['out_of_scope']}")
            continue
        for q, pub in r["published"].items():
            fmt = ".3f" if q == "step_s" else ".1f"
            name, factor = PRINTED.get(q, (q, 1.0))
            if q in r["error_pct"]:
                pred, err = r["predicted"][q] * factor, f"{r['error_pct'][q]:+7.1f}%"
                lines.append(
                    f"{r['row_id']:34s} {r['subset']:11s} {name:21s} {pub * factor:10{fmt}} {pred:10{fmt}} {err:>8s}"
                )
            else:
                why = r["quantity_out_of_scope"].get(q, "")
                lines.append(
                    f"{r['row_id']:34s} {r['subset']:11s} {name:21s} {pub * factor:10{fmt}}  not predicted: {why}"
                )
    lines += ["", "a priori (the profiles' sourced constants, nothing fitted):"]
    for long, tail in ((False, ""), (True, f"  (rows at S ≥ {LONG_SEQ // 1024}K only)")):
        for subset, per_q in summary(records, long=long).items():
            for q, s in per_q.items():
                name = PRINTED.get(q, (q,))[0]
                lines.append(
                    f"{subset:11s} {name:21s} n={s['n']:<3d} median |error| {s['median_abs_pct']:5.1f}%  "
                    f"worst {s['worst_abs_pct']:5.1f}%{tail}"
                )
    if overall:
        lines += ["under each stack's constants fitted on calibration rows only (details below):"]
        lines.append(
            f"{'validation':11s} {'tokens_per_s_per_gpu':21s} n={overall['n']:<3d} median |error| "
            f"{overall['median']:5.1f}%  worst {overall['worst']:5.1f}%"
        )
        if overall["n_long"]:
            lines.append(
                f"{'validation':11s} {'tokens_per_s_per_gpu':21s} n={overall['n_long']:<3d} median |error| "
                f"{overall['median_long']:5.1f}%  (rows at S ≥ {LONG_SEQ // 1024}K only)"
            )
    lines += ["", "fit on calibration rows only (tspbench/predict/fit.py; the headline keeps the a-priori constants):"]
    for f in fits or []:
        if f["values"] is None:
            lines.append(
                f"  stack {f['stack']}: fewer than two in-scope calibration rows with tokens/s and no base stack's "
                "fit: nothing fitted"
            )
            continue
        vals = ", ".join(f"{k} = {v:.2f}" for k, v in f["values"].items())
        own = ", ".join(f["fitted"]) or "none"
        taken = f"; the others from stack {f['taken_from']}" if f["taken_from"] and len(f["fitted"]) < 2 else ""
        lines.append(
            f"  stack {f['stack']}: {vals} (× the profile's a-priori efficiency) from {len(f['rows'])} calibration "
            f"rows (throughput: tokens/s, else MFU, else iteration time; log least sq.; fitted on its own rows: "
            f"{own}{taken})"
        )
        if f["at_bound"]:
            lines.append(
                "    AT THE SEARCH'S BOUND: these rows do not determine the constants (or the model's structure does "
                "not fit them); the validation errors below are no evidence"
            )
        for rid in f["rows"]:
            before, after = f["before_pct"][rid], f["residuals_pct"][rid]
            lines.append(f"    {rid:34s} a priori {before:+7.1f}%   fitted residual {after:+7.1f}%")
        if f["validation"]:
            v = f["validation"]
            lines.append(
                f"  validation rows of stack {f['stack']} (n={v['n']}), throughput |error|: a priori median "
                f"{v['median_before']:.1f}% worst {v['worst_before']:.1f}%; fitted median {v['median_after']:.1f}% "
                f"worst {v['worst_after']:.1f}%"
            )
            if v.get("n_long"):
                lines.append(
                    f"    of which at S ≥ {LONG_SEQ // 1024}K (n={v['n_long']}): a priori median "
                    f"{v['median_before_long']:.1f}%; fitted median {v['median_after_long']:.1f}%"
                )
    if overall:
        lines.append(
            f"  every stack, validation rows under their stack's fitted constants (n={overall['n']}), tokens/s "
            f"|error|: median {overall['median']:.1f}% worst {overall['worst']:.1f}%"
            + (
                f"; at S ≥ {LONG_SEQ // 1024}K (n={overall['n_long']}) median {overall['median_long']:.1f}%"
                if overall["n_long"]
                else ""
            )
        )
        for rid, e in overall["per_row_pct"].items():
            lines.append(
                f"    {rid:42s} fitted {e:+7.1f}%" + (" (no fit: a priori)" if rid in overall["unfitted"] else "")
            )
        for rid, (q, e) in overall["other_pct"].items():
            name = PRINTED.get(q, (q,))[0]
            lines.append(f"    {rid:42s} fitted {e:+7.1f}% ({name}; not in the tokens/s figures)")
        if overall["at_bound"]:
            lines.append(f"    stacks at the search's bound (no evidence): {', '.join(overall['at_bound'])}")
    if reserve is None:  # the allocator's reserve (tspbench/predict/fit.py fit_reserve)
        lines.append("  allocator reserve: no in-scope calibration row publishes a reserved peak: nothing fitted")
        return "\n".join(lines)
    lines.append(
        f"  allocator reserve (reserved ÷ allocated − 1) = {reserve.value:.3f} (a priori {ALLOCATOR_RESERVE:.2f}) "
        f"from {len(reserve.rows)} calibration rows publishing a reserved peak (peak memory, log least sq.)"
    )
    for rid in reserve.rows:
        before, after = reserve.before_pct[rid], reserve.residuals_pct[rid]
        lines.append(f"    {rid:34s} a priori {before:+7.1f}%   fitted residual {after:+7.1f}%")
    if reserve.validation:
        v = reserve.validation
        lines.append(
            f"  validation rows publishing a reserved peak (n={v['n']}), peak memory |error|: a priori median "
            f"{v['median_before']:.1f}% worst {v['worst_before']:.1f}%; fitted median {v['median_after']:.1f}% "
            f"worst {v['worst_after']:.1f}%"
        )
    return "\n".join(lines)


@dataclass
class ValidateConfig:
    """`python -m tspbench.validate`: which published measurements, and where their records go."""

    files: list[str] = field(default_factory=list)
    """Published-measurement YAML files, shaped like conf/published/*.yaml (default: every file there)."""
    out: Annotated[str, Output()] = "results/validation.jsonl"
    """JSONL file the validation records are written to (docs/records.md#validation-records), atomically."""
    peers_out: Annotated[str, Output()] = ""
    """JSONL file the peers' estimates beside ours are written to (docs/records.md#peer-estimate-records), atomically;
    "" (default): peers.jsonl beside `out`."""


EXAMPLES = [
    "python -m tspbench.validate                                   # every row of conf/published",
    "python -m tspbench.validate out=results/validation.jsonl conf/published/measurements.yaml",
]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if cli.wants_help(argv):
        intro = "Predict published third-party measurements with the cost model; print the errors."
        print(cli.help_text("tspbench.validate", ValidateConfig(), intro, EXAMPLES, positional="files"))
        return 0
    try:
        vc = cli.parse_options(ValidateConfig, argv, positional="files")
        files = [Path(f) for f in vc.files] or default_files()
        for f in files:
            if not f.is_file():
                raise ConfigError(f"FILE {f} does not exist; give YAML files shaped like conf/published/*.yaml")
        rows = load_rows(files)
        records = [record(r) for r in rows]
    except (ConfigError, ValueError) as e:
        print(f"tspbench.validate: {e}", file=sys.stderr)
        return 2
    by_stack = fits(rows)  # once: the summaries and the every-stack errors share it
    annotate_fitted(records, rows, by_stack)
    print(render(records, fit_summaries(rows, by_stack), fit_reserve(rows), fitted_validation(rows, by_stack)))
    out = Path(vc.out)
    written = write_records(out, records, kind="validation")  # atomic, each record guarded (record/kinds.py)
    bad = [r for r in written if r.get("status") == "implausible"]
    print(
        f"\nwrote {len(written)} records to {out}" + (f" ({len(bad)} implausible: {bad[0]['reason']})" if bad else "")
    )
    from tspbench.peers.estimators import peer_records, section  # last: the peers' estimators (docs/method.md#peers)

    peers = peer_records(files)
    print("\n" + section(records=peers))
    peers_out = Path(vc.peers_out) if vc.peers_out else out.with_name("peers.jsonl")
    write_records(peers_out, peers, kind="peer_estimate")
    print(f"wrote {len(peers)} records to {peers_out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
