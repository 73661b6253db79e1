"""The README's headline block is exactly what `python -m tspbench.headline` prints (no hand-copied number), each
side is at its best by the rule tspbench/paper/best.py states, and a ratio inside the model's error is said so."""

from pathlib import Path

from tspbench.paper.best import EVERY_OPTION, best_per_scheme, strongest_baseline
from tspbench.paper.headline import MAIN, headline_markdown
from tspbench.parallel import layout_fields
from tspbench.predict.planner import PlanRequest, plan

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_headline_is_generated():
    text = README.read_text()
    block = text.split("<!-- headline:start -->\n", 1)[1].split("\n<!-- headline:end -->", 1)[0]
    assert block == headline_markdown()


def test_each_side_is_the_fastest_that_fits_over_every_option():
    best = best_per_scheme(MAIN)
    for name, lay in best.items():
        req = PlanRequest(
            MAIN.model,
            MAIN.seq_len,
            MAIN.gpus,
            MAIN.hardware,
            options=EVERY_OPTION,
            schemes=(name,),
            degrees=(MAIN.degree,),
        )
        ranked, n = plan(req)
        assert lay is not None and n > 1 and all(lay.tokens_per_s_per_gpu >= r.tokens_per_s_per_gpu for r in ranked)
    base = strongest_baseline(best)
    top = max(lay.tokens_per_s_per_gpu for n, lay in best.items() if n != "tsp" and lay)
    assert base is not None and base.tokens_per_s_per_gpu >= 0.995 * top and base.par.scheme != "tsp"
    md = headline_markdown()
    assert "each side at its best" in md and layout_fields(best["tsp"].par)["scheme"] == "tsp"


def test_the_headline_prints_the_verdict_functions_answer():
    """The sentence and every reading carry tspbench/predict/verdict.py's band and answer for the same layouts."""
    from tspbench.paper.best import compare_best

    best = best_per_scheme(MAIN)
    c = compare_best(MAIN, best["tsp"], strongest_baseline(best))
    md = headline_markdown()
    assert f"**Verdict: {c.verdict}** — TSP ÷ it = {c.band}" in md and c.moves_most in md
    assert c.band.low <= c.band.central <= c.band.high


def test_changes_table_ends_at_the_headline_and_starts_at_the_first_rule():
    """The last state of the before → after table is the headline's own selection (same layouts, same numbers); the
    first prices nothing added since and fixes full recompute, B = 1; each change alters the state it says."""
    from dataclasses import replace

    from tspbench.paper.changes import CHANGES, FIRST_PRICING, State, after, sides
    from tspbench.predict.costmodel import PRICING

    best = best_per_scheme(MAIN)
    t, b = sides(after(), MAIN)
    assert t == best["tsp"] and b == strongest_baseline(best)
    assert after().pricing == PRICING and not after().fixed and after().hsdp
    first = State()
    assert first.fixed and not first.hsdp and first.pricing == FIRST_PRICING
    assert all(
        getattr(FIRST_PRICING, f) != getattr(PRICING, f)
        for f in ("dp_overlap", "tp_async", "tsp_kv_pipeline", "elementwise")
    )
    assert all(apply(first) != first for _, apply in CHANGES)
    t0, _ = sides(first, MAIN)
    assert t0 is not None and t0.par.recompute == "full" and t0.batch == 1
    assert t0.par == replace(t0.par, kv_bucket_heads=0, mlp_exchange="ring", regather_kv=True)


def test_changes_refuses_a_readme():
    from tspbench.headline import main

    assert main(["changes=true", "readme=README.md"]) == 2


def test_a_missing_file_gets_one_line_naming_the_field(capsys, tmp_path):
    """readme= (headline) and spec= (the rank's entry) that do not exist: one line naming the field, exit 2."""
    from tspbench.headline import main
    from tspbench.run.worker import main as worker

    assert main([f"readme={tmp_path / 'nope.md'}"]) == 2
    assert worker([f"spec={tmp_path / 'nope.json'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[0].startswith("tspbench.headline: readme=") and "does not exist" in err[0]
    assert err[1].startswith("tspbench.run.worker: spec=") and "does not exist" in err[1]
