"""The `rollwise` command. Stages run through `dvc repro` or the Prefect flow; this holds the
commands a user runs on their results."""

from __future__ import annotations

import argparse
import sys

from rollwise import compare, params_cmd


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
    params_cmd.add_arguments(
        commands.add_parser(
            "params",
            help="the resolved configuration, or the reference of every key",
            description=params_cmd.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )
    args = parser.parse_args(argv)
    return {"compare": compare.run, "params": params_cmd.run}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
