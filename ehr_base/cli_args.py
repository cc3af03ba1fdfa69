"""Command-line misuse answered in one line with exit code 2, shared by every console script.

A wrong flag value, a missing folder or the wrong file is the user's to fix: they get one line
on stderr, `PROG: error: WHAT (see PROG --help)`, and exit code 2 (argparse's convention), never
a traceback or a screenful of usage. The checks run before any heavy import or any work, so a
typo costs no training time. Errors in the data itself are the readers' to report.
"""
from __future__ import annotations

import argparse
import logging
import pathlib
import sys

EXIT_USAGE = 2


def one_line(message: object) -> str:
    """The message on one line: its lines joined by '; ', or by ' ' after a line ending in ':'."""
    text = ""
    for part in (p.strip() for p in str(message).splitlines()):
        if part:
            text += (" " if text.endswith(":") else "; " if text else "") + part
    return text


def usage_error(prog: str, message: object) -> int:
    """Prints `PROG: error: MESSAGE` as one line on stderr; returns EXIT_USAGE."""
    print(f"{prog}: error: {one_line(message)}", file=sys.stderr)
    return EXIT_USAGE


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line and exit code 2 (sub-parsers inherit the class)."""

    def error(self, message: str):
        """Prints `PROG: error: MESSAGE (see PROG --help)` and exits with EXIT_USAGE."""
        self.exit(EXIT_USAGE, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


def _is_url(value: str) -> bool:
    return "://" in value


def existing_dir(value: str) -> str:
    """argparse type: a folder that exists (remote filesystem URLs pass unchecked)."""
    path = pathlib.Path(value)
    if not _is_url(value) and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{value} {'is not a folder' if path.exists() else 'does not exist'}")
    return value


def existing_file(value: str) -> str:
    """argparse type: a file that exists."""
    path = pathlib.Path(value)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{value} {'is not a file' if path.exists() else 'does not exist'}")
    return value


def output_dir(value: str) -> str:
    """argparse type: a folder to write to: absent (it is created) or a folder, not a file."""
    if not _is_url(value) and pathlib.Path(value).exists() and not pathlib.Path(value).is_dir():
        raise argparse.ArgumentTypeError(f"{value} is a file, not a folder")
    return value


def fraction(value: str) -> float:
    """argparse type: a number in (0, 1] (a coverage, a risk)."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {value!r}") from None
    if not 0.0 < number <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {value!r}")
    return number


def positive_int(value: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {number}")
    return number


def setup_logging(verbose: bool = False) -> None:
    """Timestamped logs at INFO (DEBUG and every library's notices when verbose) for every command line tool.

    Call it before any heavy import: with ``verbose`` it also lets TensorFlow's C++ runtime speak,
    which it reads only when it loads (ehr_base.console).
    """
    from ehr_base import console

    if verbose:
        console.verbose_native_logs()
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    # absl/TensorFlow log every tf.data shard and SavedModel input rename at INFO, Beam its BigQuery
    # and type-hint notices: keep ours readable.
    console.quiet_library_loggers(verbose)


class DefaultsOnceFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help with each flag's default said once: argparse's '(default: X)' is added only where the help text
    does not already say its default (in words argparse's value would contradict, e.g. 'gzip' for True),
    and not to a required flag, which has none."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text.lower() or action.required:
            return text
        return super()._get_help_string(action)
