"""`python -m tspbench.verify scheme=tsp degree=4 ...`: prove a scheme equal to the single-device model.

Prints the max abs and relative error per tensor and exits non-zero on any mismatch (1), or with one line
and exit code 2 on a bad configuration, before any rank starts. `--help` lists every option.
"""

from __future__ import annotations

import sys

from tspbench import cli
from tspbench.config import ConfigError
from tspbench.verify.case import VerifyConfig
from tspbench.verify.runner import format_result, run_cases

EXAMPLES = [
    "python -m tspbench.verify scheme=tsp degree=4                      # D = 4, float64, gloo ranks spawned here",
    "python -m tspbench.verify scheme=tp_sp degree=8 tp=2 sp_variant=ring seq_len=64",
    "python -m tspbench.verify scheme=sp degree=2 dp=2 recompute=full model.n_kv_heads=2",
    "python -m tspbench.verify scheme=sp degree=4 sp_variant=ulysses   # DeepSpeed-Ulysses all-to-all",
    "python -m tspbench.verify scheme=tsp degree=4 decode_steps=4      # serving: prefill + 4 decoded tokens",
    "python -m tspbench.verify scheme=tsp degree=2 decode_steps=16 greedy=true  # 16 greedy tokens, exact",
]


def compose(overrides: list[str]) -> VerifyConfig:
    """conf/verify.yaml + overrides → the typed VerifyConfig (Hydra's Compose API)."""
    cli.register().store(name="verify_schema", node=VerifyConfig)
    return cli.compose("verify", overrides)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if cli.wants_help(argv):
        print(
            cli.help_text(
                "tspbench.verify",
                compose([]),
                __doc__.split("\n\n")[0],
                EXAMPLES,
                {"model": f"presets: {cli.presets('model')}"},
            )
        )
        return 0
    try:
        vc = compose(argv)
        vc.validate()
    except ConfigError as e:
        print(f"tspbench.verify: {e}", file=sys.stderr)
        return 2
    results = run_cases([(vc, None)], vc.parallel().world_size, vc.device)
    for r in results:
        print(format_result(r))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
