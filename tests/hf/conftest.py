"""tests/hf: the xdist_group mark is known also when pytest-xdist is not loaded (-p no:xdist)."""


def pytest_configure(config):
    config.addinivalue_line("markers", "xdist_group(name): tests that share a spawned rank group (pytest-xdist)")
