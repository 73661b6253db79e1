"""The report's trust section renders the peer-estimate records (tspbench/peers/estimators.py) as its peer
subsection, and nothing of it without them."""

from __future__ import annotations

from tspbench.paths import conf_dir
from tspbench.report.trust import trust_section


def test_peer_subsection_from_records():
    from tspbench.peers.estimators import peer_records

    recs = peer_records([conf_dir() / "published" / "measurements.yaml"])
    html = str(trust_section([], peers=recs))
    assert 'id="trust-peers-table"' in html and "paper_tp_8_128k" in html and "tokens/s per GPU" in html
    assert html.count("<tr><td>") == len(recs)


def test_peer_subsection_without_records():
    assert "trust-peers" not in str(trust_section([])) + str(trust_section([], peers=[]))
