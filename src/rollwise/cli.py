"""The `rollwise` command. Stages run through `dvc repro` or the Prefect flow; this holds the
commands a user runs on their results."""

from __future__ import annotations

import argparse
import sys

from rollwise import compare


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rollwise")
    commands = parser.add_subparsers(dest="command", required=True)
    compare.add_arguments(
        commands.add_parser(
            "compare",
            help="pipeline runs side by side: a table and a plot",
            description=compare.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )
    args = parser.parse_args(argv)
    return compare.run(args)


if __name__ == "__main__":
    sys.exit(main())
