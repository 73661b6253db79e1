"""conf/published/xtuner.yaml: XTuner's long-sequence Ulysses throughput rows (docs/method.md#xtuner-rows)."""

from __future__ import annotations

import re

from tspbench.paths import conf_dir
from tspbench.predict import published
from tspbench.predict.fit import calibration_rows, fit

FILE = conf_dir() / "published" / "xtuner.yaml"
ROWS = published.load_rows([FILE])


def test_the_split_is_positional_and_every_row_is_a_deepspeed_ulysses_layout_of_its_gpus():
    assert len(ROWS) == 15
    assert [r.subset for r in ROWS] == ["calibration" if i % 3 == 0 else "validation" for i in range(len(ROWS))]
    for r in ROWS:
        sp = int(re.search(r"_sp(\d+)$", r.id).group(1))  # the config's SP degree, in the id
        assert r.stack == "deepspeed" and not r.out_of_scope and r.seq_len >= published.LONG_SEQ
        assert r.recompute == "full" and r.micro_batch == 1 and r.hardware == "a100"
        if sp == 1:
            assert r.layout == {"scheme": "single", "degree": 1, "fsdp": True}
        else:
            lay = r.layout
            assert (lay["scheme"], lay["sp_variant"], lay["degree"]) == ("fsdp_sp", "ulysses", sp)
            assert lay["dp"] == lay["dp_shard"] == r.gpus // sp
        assert set(r.measured) == {"tokens_per_s_per_gpu"}
        assert "tokens_per_s_per_gpu" in published.record(r)["error_pct"]


def test_the_deepspeed_stack_is_fitted_on_these_calibration_rows_alone():
    every = published.load_rows(published.default_files())
    f = fit(every, "deepspeed")
    assert f is not None and not f.at_bound
    assert (
        set(f.rows)
        == {r.id for r in calibration_rows(ROWS, "deepspeed")}
        == {r.id for r in ROWS if r.subset == "calibration"}
    )
