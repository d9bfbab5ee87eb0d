"""Command line: argument parsing and one function per subcommand."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from kf_culler import __version__

EXIT_CODES = """exit codes:
  0  success (decide: a verdict was printed; check: the pass completed)
  1  a runtime failure (the API server could not be reached, a component failed to start)
  2  bad input or configuration (the message names the key or the problem)
"""


def cmd_decide(args: argparse.Namespace) -> int:
    from kf_culler.config import ConfigError
    from kf_culler.model import InputError
    from kf_culler.scenario import verdict_for_text

    source = "<stdin>" if args.input == "-" else args.input
    try:
        text = sys.stdin.read() if args.input == "-" else open(args.input, encoding="utf-8").read()
    except (OSError, UnicodeDecodeError) as err:
        print(f"kf-culler decide: {source}: cannot read: {err}", file=sys.stderr)
        return 2
    try:
        verdict = verdict_for_text(text, source)
    except (InputError, ConfigError) as err:
        print(f"kf-culler decide: {err}", file=sys.stderr)
        return 2
    print(json.dumps(verdict.to_dict(), indent=None if args.compact else 2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kf-culler",
        description="Idle culler for Kubeflow Notebooks: reads Jupyter, code-server, RStudio and GPU signals "
        "and stops idle notebooks through kubeflow-resource-stopped, saying why.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"kf-culler {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("decide", help="decide one scenario file (see docs/decisions.md) and print the verdict",
                       epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", "-i", required=True, metavar="FILE|-", help="scenario JSON, or - for stdin")
    p.add_argument("--compact", action="store_true", help="print the verdict on one line")
    p.set_defaults(func=cmd_decide)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result
