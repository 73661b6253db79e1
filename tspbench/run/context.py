"""The records an experiment's report needs beside its runs: how far to trust the cost model, and the planner's
view of the paper's cluster.

The report reads records only (tspbench/report/build.py); its "How far to trust the predictions" section needs
validation records and its Pareto page plan records. An experiment writes them next to its results, through
tspbench.record.store.write_records (atomic, each record guarded: docs/records.md#record-kinds-writers-and-guards):

    <out_dir>/validation.jsonl  the cost model against every row of conf/published (tspbench.predict.published),
                                as `python -m tspbench.validate out=<out_dir>/validation.jsonl` writes it
    <out_dir>/verdict.jsonl     the verdict of TSP at its best against the strongest baseline at its best in the
                                README headline's setting (tspbench.paper.headline.main_comparison;
                                docs/method.md#verdict), what the report's first screen answers with
    <out_dir>/plan.jsonl        the planner's fitting layouts on the paper's setting (predict/planner.py
                                PAPER_SETTING: llama7b, 128K, 1,024 MI300X) under the `schedule` overlap rule, as
                                `python -m tspbench.plan model=llama7b seq_len=131072 gpus=1024 hardware=mi300x
                                out=<out_dir>/plan.jsonl` writes them
    <out_dir>/fit.jsonl         what fits (tspbench/predict/fitrecords.py): the longest sequence of each scheme and
                                option set per recompute mode on 8 GPUs of every device profile (conf/hardware,
                                FIT_HARDWARE), for the paper's model; and the TSP ≤ TP communication crossover of that
                                model at D = 8, B = 1, forward and training, from the cost model on a fine grid of
                                sequence lengths (kinds "fit" and "crossover", guarded by fitrecords.check_fit: the
                                report's "what fits" figure and its communication figure's crossover)
    <out_dir>/peers.jsonl       the peers' estimators (llm-analysis, DeepSpeed's ZeRO estimator) beside ours
                                (tspbench/peers/estimators.py, kind "peer_estimate"), as `python -m tspbench.validate`
                                prints them: the report's trust section tabulates them

Closed form all five: a few seconds together, no device.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tspbench.config import model_preset
from tspbench.predict import fitrecords
from tspbench.predict.planner import PAPER_SETTING, PlanRequest, plan, plan_records
from tspbench.predict.published import default_files, load_rows, record
from tspbench.record.store import write_records


def peer_records() -> list[dict[str, Any]]:
    """The peers' estimators beside ours (tspbench/peers/estimators.py; docs/method.md#peers): what the report's trust
    section tabulates. Imported here, not at the top: the peers' packages are optional and load only when asked."""
    from tspbench.peers.estimators import peer_records as records

    return records()


VALIDATION_FILE = "validation.jsonl"
PLAN_FILE = "plan.jsonl"
VERDICT_FILE = "verdict.jsonl"
FIT_FILE = fitrecords.FIT_FILE
PEERS_FILE = "peers.jsonl"
FIT_GPUS = 8
"""The cluster of the fit records: one node of each device profile (the paper's replica)."""
PLAN_OVERLAP = "schedule"
"""The overlap rule of the paper setting's plan (the planner's default; docs/method.md#choice-overlap)."""


def validation_records() -> list[dict[str, Any]]:
    """One validation record per row of conf/published (docs/records.md#validation-records)."""
    return [record(row) for row in load_rows(default_files())]


def paper_plan_records() -> list[dict[str, Any]]:
    """The planner's records for the paper's setting (docs/records.md#plan-records), best layout first."""
    s = PAPER_SETTING
    ranked, _ = plan(
        PlanRequest(model_preset(s["model"]), s["seq_len"], s["gpus"], s["hardware"], overlap=PLAN_OVERLAP)
    )
    return plan_records(ranked, **s, overlap=PLAN_OVERLAP)


def verdict_records() -> list[dict[str, Any]]:
    """The headline's verdict as a record (docs/records.md#verdict-records)."""
    from tspbench.paper.headline import main_comparison

    return [main_comparison()[1].record()]


def fit_context_records() -> list[dict[str, Any]]:
    """The "fit" records of the paper's model on FIT_GPUS devices of every profile in fitrecords.FIT_HARDWARE and its
    TSP ≤ TP communication crossovers at D = FIT_GPUS, B = 1 (forward, train)."""
    model = model_preset(PAPER_SETTING["model"])
    crossings = [fitrecords.comm_crossover(model, FIT_GPUS, 1, mode) for mode in ("forward", "train")]
    return [*fitrecords.fit_records(model, FIT_GPUS), *crossings]


def write_fit_records(path: str | Path, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Replace `path` by a JSONL file of fit and crossover records, atomically, each guarded as its kind
    (record/kinds.py: fitrecords.check_fit) and marked `implausible` with its `reason` when a check fails."""
    return write_records(path, records, kind=("fit", "crossover"))


def write_context_records(out_dir: Path) -> list[Path]:
    """Write `out_dir`/validation.jsonl, plan.jsonl, verdict.jsonl and fit.jsonl (replacing earlier ones,
    atomically) and return their paths, to be given to the report with the run records (tspbench.report.finish)."""
    out_dir = Path(out_dir)
    validation, plans, verdicts = out_dir / VALIDATION_FILE, out_dir / PLAN_FILE, out_dir / VERDICT_FILE
    fits = out_dir / FIT_FILE
    write_records(validation, validation_records(), kind="validation")
    write_records(plans, paper_plan_records(), kind="plan")
    write_records(verdicts, verdict_records(), kind="verdict")
    write_fit_records(fits, fit_context_records())
    peers = out_dir / PEERS_FILE
    write_records(peers, peer_records(), kind="peer_estimate")
    return [validation, plans, verdicts, fits, peers]
