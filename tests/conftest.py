"""Shared fixtures. The parity matrix (parity_cases.py) runs in one spawned rank group per world size, and
only the cases the selected tests need: `pytest -k tsp-D4` spawns one group of 4 ranks running the
tsp-D4 cases, not every case of that world size. A test that reads cases other than its own `cid` parameter
names them with `@pytest.mark.parity_cases("cid", ...)`."""

from __future__ import annotations

import pytest

from tspbench.verify.runner import run_cases

_SELECTED: set[str] = set()


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")
    config.addinivalue_line("markers", "parity_cases(*cids): parity cases a test reads besides its `cid` parameter")


SLOW_WORLDS = (6,)
"""Parity cases of these world sizes are `slow` (left out of the CI command `pytest -m "not slow"`): tp_sp at D = 6."""


@pytest.hookimpl(tryfirst=True)  # before -m deselection reads the marks
def pytest_itemcollected(item):
    cid = getattr(item, "callspec", None) and item.callspec.params.get("cid")
    if cid and "parity_results" in getattr(item, "fixturenames", ()):
        from parity_cases import ALL, DECODE

        world = (ALL.get(cid) or DECODE.get(cid) or (None,))[0]
        if world in SLOW_WORLDS:
            item.add_marker(pytest.mark.slow)


CHUNK = 60
"""Parity cases per rank-group launch: a world size's selected cases run in chunks of this many, each chunk once
per session on one worker (under pytest-xdist the chunks of one world spread over the workers). Each launch costs
every rank ~5 s of imports (torch, DTensor, dynamo via the optimizer) before its first case, ~0.5–1 s per case
after: 60 gives the full matrix 6 launches (D = 2: 2, D = 3: 1, D = 4: 2, D = 8: 1), enough to keep 2 workers busy."""


def _cids_of(item) -> list[str]:
    if "parity_results" not in getattr(item, "fixturenames", ()):
        return []
    cids = [getattr(item, "callspec", None) and item.callspec.params.get("cid")]
    cids += [c for mark in item.iter_markers("parity_cases") for c in mark.args]
    return [c for c in cids if c]


def _chunks(world: int) -> dict[str, int]:
    """case id → chunk index, over the selected cases of `world` in the matrix's order."""
    from parity_cases import all_cases_for_world, case_id

    ids = [case_id(vc, b) for vc, b in all_cases_for_world(world) if case_id(vc, b) in _SELECTED]
    return {cid: i // CHUNK for i, cid in enumerate(ids)}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`-n 2 --dist loadgroup`, the README's command) the parity tests of one chunk of one world
    size go to the same worker, so each chunk's rank group is spawned once. Micro-benchmarks run only when asked
    for by name (`-m bench`), whatever else -m says."""
    if config.pluginmanager.hasplugin("xdist"):
        from parity_cases import ALL, DECODE

        _select(items)
        chunks: dict[int, dict[str, int]] = {}
        for item in items:
            for cid in _cids_of(item):
                world = (ALL.get(cid) or DECODE.get(cid) or (None,))[0]
                if world is not None:
                    idx = chunks.setdefault(world, _chunks(world)).get(cid, 0)
                    item.add_marker(pytest.mark.xdist_group(f"parity-w{world}-c{idx}"))
                    break
    if "bench" in (config.option.markexpr or ""):
        return
    bench = [i for i in items if i.get_closest_marker("bench")]
    if bench:
        config.hook.pytest_deselected(items=bench)
        items[:] = [i for i in items if not i.get_closest_marker("bench")]


def _select(items) -> None:
    _SELECTED.clear()
    for item in items:
        _SELECTED.update(_cids_of(item))


def pytest_collection_finish(session):  # after -k / -m deselection: the items that will run
    _select(session.items)


class _Results(dict):
    """The results of one world size, computed a chunk at a time (`CHUNK` cases per rank-group launch) when a test
    first reads one of its cases; a case that is not selected fails loudly, never silently."""

    def __init__(self, world: int):
        super().__init__()
        self.world = world

    def __missing__(self, cid: str) -> dict:
        from parity_cases import all_cases_for_world, case_id

        chunks = _chunks(self.world)
        if cid not in chunks:
            raise KeyError(f"parity case {cid!r} was not run: add it to the test's @pytest.mark.parity_cases(...)")
        cases = [(vc, b) for vc, b in all_cases_for_world(self.world) if chunks.get(case_id(vc, b)) == chunks[cid]]
        for (vc, b), r in zip(cases, run_cases(cases, self.world)):
            self[case_id(vc, b)] = r
        return self[cid]


@pytest.fixture(scope="session")
def parity_results():
    """world size → {case id: result dict} for the selected cases of that world, each computed once per session."""
    cache: dict[int, _Results] = {}

    def get(world: int) -> _Results:
        if world not in cache:
            cache[world] = _Results(world)
        return cache[world]

    return get
