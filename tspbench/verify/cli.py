"""`python -m tspbench.verify scheme=tsp degree=4 ...`: prove a scheme equal to the single-device model.

Prints the max abs and relative error per tensor and exits non-zero on any mismatch (1), or with one line
and exit code 2 on a bad configuration, before any rank starts.
"""
from __future__ import annotations

import sys

from tspbench.config import ConfigError
from tspbench.verify.case import VerifyConfig
from tspbench.verify.runner import format_result, run_cases


def compose(overrides: list[str]) -> VerifyConfig:
    """Hydra compose (no output dirs, no @hydra.main) into the typed VerifyConfig."""
    from hydra import compose as hcompose, initialize_config_dir
    from omegaconf import OmegaConf

    from tspbench.cli import CONF_DIR

    from tspbench.cli import register
    register().store(name="verify_schema", node=VerifyConfig)
    with initialize_config_dir(str(CONF_DIR), version_base=None):
        cfg = hcompose("verify", overrides=overrides)
    obj = OmegaConf.to_object(cfg)
    return obj


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        vc = compose(argv)
        vc.validate()
    except ConfigError as e:
        print(f"tspbench.verify: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # Hydra's own composition errors (misspelt key, wrong type): one line
        if type(e).__module__.startswith(("hydra", "omegaconf")):
            print(f"tspbench.verify: {str(e).splitlines()[0]}", file=sys.stderr)
            return 2
        raise
    results = run_cases([(vc, None)], vc.parallel().world_size, vc.device)
    for r in results:
        print(format_result(r))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
