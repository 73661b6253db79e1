"""Strict comm (NCCL's rules on every collective, docs/method.md#gpu-rules) is on in test runs of the worker and off in
measured runs: TSPBENCH_STRICT says so explicitly, else CI or pytest switch it on; any other value is refused."""

from __future__ import annotations

import pytest

from tspbench.config import ConfigError
from tspbench.run.worker import strict_requested


@pytest.mark.parametrize(
    "env,on",
    [
        ({}, False),
        ({"CI": "true"}, True),
        ({"PYTEST_CURRENT_TEST": "test_x (call)"}, True),
        ({"TSPBENCH_STRICT": "1"}, True),
        ({"TSPBENCH_STRICT": "0", "CI": "true"}, False),
    ],
)
def test_strict_switch(env, on):
    assert strict_requested(env) is on


def test_unknown_value_is_refused():
    with pytest.raises(ConfigError, match="TSPBENCH_STRICT='yes' is unknown; allowed: 1"):
        strict_requested({"TSPBENCH_STRICT": "yes"})
