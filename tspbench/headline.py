"""`python -m tspbench.headline [readme=README.md] [changes=true]`: the README's lead, TSP against the strongest
baseline, each side at its best, in one sentence and two small tables (every number modelled;
tspbench/paper/headline.py says how).

The command line only. Prints the Markdown block; with `readme=PATH` it also writes the block between that file's
`<!-- headline:start -->` and `<!-- headline:end -->` markers (tests/unit/test_headline.py holds the README's block
equal to what this prints). With `changes=true` it prints instead the before → after table: what each fair-fight
change did to the verdict, alone and all together, at 16K and 128K (tspbench/paper/changes.py).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from tspbench import cli
from tspbench.config import ConfigError, Output
from tspbench.paper.changes import changes_markdown
from tspbench.paper.headline import headline_markdown

START, END = "<!-- headline:start -->\n", "\n<!-- headline:end -->"


@dataclass
class HeadlineConfig:
    """`python -m tspbench.headline`: where the block goes besides the terminal."""

    readme: Annotated[str | None, Output(exists=True, hint="the README to rewrite (e.g. readme=README.md)")] = None
    """Rewrite the block between this file's headline markers (e.g. README.md); null: print only."""
    changes: bool = False
    """Print the before → after table of the fair-fight changes instead of the headline (readme must be null)."""


EXAMPLES = [
    "python -m tspbench.headline                      # print the block",
    "python -m tspbench.headline readme=README.md     # and regenerate the README's lead",
    "python -m tspbench.headline changes=true         # what each fair-fight change did, alone and together",
]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if cli.wants_help(argv):
        print(
            cli.help_text("tspbench.headline", HeadlineConfig(), __doc__.split("\n\n")[0].split(": ", 1)[1], EXAMPLES)
        )
        return 0
    try:
        hc = cli.parse_options(HeadlineConfig, argv)
        text = Path(hc.readme).read_text() if hc.readme else ""
        if hc.readme and (START not in text or END not in text):
            raise ConfigError(f"readme={hc.readme} has no headline markers ({START.strip()} … {END.strip()})")
        if hc.changes and hc.readme:
            raise ConfigError("changes=true prints the before → after table only; allowed with it: readme=null")
    except (ConfigError, OSError) as e:
        print(f"tspbench.headline: {e}", file=sys.stderr)
        return 2
    if hc.changes:
        print(changes_markdown())
        return 0
    block = headline_markdown()
    print(block)
    if hc.readme:
        head, rest = text.split(START, 1)
        Path(hc.readme).write_text(head + START + block + END + rest.split(END, 1)[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
