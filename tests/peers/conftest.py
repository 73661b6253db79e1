"""tests/peers: under pytest-xdist (`-n 2 --dist loadgroup`, the README's command) every test of
test_torch_parallel.py goes to one worker, so its module-scoped rank group is spawned once, not once per worker."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config, items):
    if config.pluginmanager.hasplugin("xdist"):
        for item in items:
            if item.path.name == "test_torch_parallel.py" and item.path.parent.name == "peers":
                item.add_marker(pytest.mark.xdist_group("peers-torch-parallel"))
