"""Every scheme equals the single-device model: logits, loss, every gradient and every parameter after one
AdamW step, in float64 on CPU (gloo ranks spawned by the fixture). Tolerance: tspbench.verify.case.TOL (1e-10
normwise relative in float64; the module docstring there explains it). Broken variants must FAIL the same
comparison, so the check cannot pass vacuously.
"""

from __future__ import annotations

import pytest
from parity_cases import ALL


def _failures(res: dict) -> str:
    return "\n".join(
        f"  {c['name']}: rel {c['max_rel']:.3e} > tol {c['tol']:.0e}" for c in res["checks"] if not c["ok"]
    )


@pytest.mark.parametrize("cid", [k for k, v in ALL.items() if v[2] is None])
def test_scheme_matches_single_device(parity_results, cid):
    world, vc, _ = ALL[cid]
    res = parity_results(world)[cid]
    names = {c["name"] for c in res["checks"]}
    # logits, loss, a gradient and an updated value for every reference parameter were compared
    assert {"loss", "logits"} <= names and sum(n.startswith("grad/") for n in names) == 3 + 9 * 2
    n_param = sum(n.startswith("param/") for n in names)
    assert n_param == (3 + 9 * 2 if vc.dtype == "float64" else 0)  # optimiser step checked in float64
    assert res["ok"], f"{cid} mismatches:\n{_failures(res)}"


@pytest.mark.parametrize("cid", [k for k, v in ALL.items() if v[2] is not None])
def test_broken_variant_is_caught(parity_results, cid):
    world, _vc, breakage = ALL[cid]
    res = parity_results(world)[cid]
    assert not res["ok"], f"the deliberately broken variant {breakage} passed the parity check"
    worst = max(c["max_rel"] for c in res["checks"])
    assert worst > 1e3 * res["checks"][0]["tol"], "a real bug should miss by orders of magnitude"


def test_matrix_meets_every_model_and_recompute_per_scheme():
    """The covering design of parity_cases.covering: each scheme of the D = 2, 3, 4 matrix meets MHA and GQA with
    every recompute mode somewhere in float64, and every variant runs both models without recompute."""
    met: dict[str, set] = {}
    none_models: dict[tuple, set] = {}
    for world, vc, breakage in ALL.values():
        if breakage is None and vc.dtype == "float64" and vc.scheme != "single":
            gqa = vc.model.n_kv_heads < vc.model.n_heads
            met.setdefault(vc.scheme, set()).add((gqa, vc.recompute))
            if vc.recompute == "none" and vc.dp == 1 and world in (2, 3, 4):
                none_models.setdefault((world, vc.scheme, vc.sp_variant, vc.tp), set()).add(gqa)
    every = {(g, rc) for g in (False, True) for rc in ("none", "selective", "full")}
    assert {s: every - m for s, m in met.items() if m != every} == {}
    assert {k for k, v in none_models.items() if len(v) < 2} == set()
