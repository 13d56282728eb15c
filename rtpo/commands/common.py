"""What every rtpo command shares: bad input is one line on stderr and exit status 2, and a report file is
written whole or not at all.  Used by rtpo.commands.cli (`rtpo run|solve|eval|config|plot`), rtpo.compare and
rtpo.commands.eval; it imports nothing of rtpo, so any command may use it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

USAGE_ERROR = 2


def one_line(message: object) -> str:
    """The message with every run of whitespace (newlines included) collapsed to one space."""
    return " ".join(str(message).split())


def fail(prog: str, message: object) -> int:
    """Print `PROG: error: MESSAGE` as one line on stderr; returns the usage exit status (2)."""
    print(f"{prog}: error: {one_line(message)}", file=sys.stderr)
    return USAGE_ERROR


class OneLineParser(argparse.ArgumentParser):
    """argparse prints usage plus the error over several lines; rtpo's contract is one line, exit 2."""

    def error(self, message: str):  # type: ignore[override]
        raise SystemExit(fail(self.prog, message))


PLUGIN_HELP = (
    "import MODULE first (repeatable): its registered methods, estimators, tasks, tools and backends "
    "become valid names; a run records it in config.yaml (rtpo.scenario.plugins, docs/plugins.md)"
)


def add_plugin_option(p: argparse.ArgumentParser) -> None:
    """`--plugin MODULE`, repeatable, into `ns.plugin` (a list)."""
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE", help=PLUGIN_HELP)


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary sibling and a rename, so a reader (or a crash) never
    sees half a file; the folder is created when missing.  OSError propagates to the caller."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_json(path: Path, payload: Any, **dumps: Any) -> None:
    """`payload` as indented JSON plus a newline, written atomically (write_atomic)."""
    write_atomic(path, json.dumps(payload, indent=2, **dumps) + "\n")
