"""Shared fixtures: the parity matrix runs once per world size per session (one spawn each)."""

from __future__ import annotations

import pytest

from tspbench.verify.runner import run_cases


@pytest.fixture(scope="session")
def parity_results():
    """world size → {case id: result dict}; computed lazily, once per world size."""
    from parity_cases import all_cases_for_world, case_id

    cache: dict[int, dict[str, dict]] = {}

    def get(world: int) -> dict[str, dict]:
        if world not in cache:
            cases = all_cases_for_world(world)
            results = run_cases(cases, world)
            cache[world] = {case_id(vc, b): r for (vc, b), r in zip(cases, results)}
        return cache[world]

    return get


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")
