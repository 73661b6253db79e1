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


SLOW_WORLDS = (3, 6, 8)
"""Parity cases of these world sizes are `slow` (left out of the quick loop `pytest -m "not slow"`)."""


@pytest.hookimpl(tryfirst=True)  # before -m deselection reads the marks
def pytest_itemcollected(item):
    cid = getattr(item, "callspec", None) and item.callspec.params.get("cid")
    if cid and "parity_results" in getattr(item, "fixturenames", ()):
        from parity_cases import ALL, DECODE

        world = (ALL.get(cid) or DECODE.get(cid) or (None,))[0]
        if world in SLOW_WORLDS:
            item.add_marker(pytest.mark.slow)


def _world_of(item) -> int | None:
    """The rank-group world size a parity test reads (its own case's, else the first named case's)."""
    if "parity_results" not in getattr(item, "fixturenames", ()):
        return None
    from parity_cases import ALL, DECODE

    cids = [getattr(item, "callspec", None) and item.callspec.params.get("cid")]
    cids += [c for mark in item.iter_markers("parity_cases") for c in mark.args]
    for cid in cids:
        if cid and (cid in ALL or cid in DECODE):
            return (ALL.get(cid) or DECODE.get(cid))[0]
    return None


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`-n 2 --dist loadgroup`, the README's command), every parity test of one world size goes
    to the same worker, so each rank group is spawned once. Micro-benchmarks run only when asked for by name
    (`-m bench`), whatever else -m says."""
    if config.pluginmanager.hasplugin("xdist"):
        for item in items:
            world = _world_of(item)
            if world is not None:
                item.add_marker(pytest.mark.xdist_group(f"parity-world{world}"))
    if "bench" in (config.option.markexpr or ""):
        return
    bench = [i for i in items if i.get_closest_marker("bench")]
    if bench:
        config.hook.pytest_deselected(items=bench)
        items[:] = [i for i in items if not i.get_closest_marker("bench")]


def pytest_collection_finish(session):  # after -k / -m deselection: the items that will run
    _SELECTED.clear()
    for item in session.items:
        if "parity_results" not in getattr(item, "fixturenames", ()):
            continue
        cid = getattr(item, "callspec", None) and item.callspec.params.get("cid")
        if cid:
            _SELECTED.add(cid)
        for mark in item.iter_markers("parity_cases"):
            _SELECTED.update(mark.args)


class _Results(dict):
    """The results of one world size; a case read that was not computed fails loudly, never silently."""

    def __missing__(self, cid: str) -> dict:
        raise KeyError(f"parity case {cid!r} was not run: add it to the test's @pytest.mark.parity_cases(...)")


@pytest.fixture(scope="session")
def parity_results():
    """world size → {case id: result dict} for the selected cases of that world, computed once per session."""
    from parity_cases import all_cases_for_world, case_id

    cache: dict[int, _Results] = {}

    def get(world: int) -> _Results:
        if world not in cache:
            cases = [(vc, b) for vc, b in all_cases_for_world(world) if case_id(vc, b) in _SELECTED]
            results = run_cases(cases, world) if cases else []
            cache[world] = _Results({case_id(vc, b): r for (vc, b), r in zip(cases, results)})
        return cache[world]

    return get
