"""The libraries' own log lines (vLLM, Ray, transformers, torch, Python warnings) go to RUN/logs/, not the console.

A run's console holds rtpo's lines only: the run folder, one line (or a bar) per phase, the result.  While
a run is being built and runs, every logger named in LIBRARIES writes to RUN/logs/<file> instead (at
the level it has, vLLM's INFO lines included, with time and logger name) and stops propagating, and
Python warnings go through logging (`logging.captureWarnings`) into RUN/logs/warnings.log.  `rtpo run --verbose` leaves all of them as they
were.  vLLM configures its logger when it is first imported (a handler on stdout, unless
VLLM_CONFIGURE_LOGGING=0): a run that has not imported it yet sets that variable for its import, and
one that has gets its handlers taken off for the run and put back after.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

LOGS_DIR = "logs"
# logger name -> file under RUN/logs/ (child loggers, e.g. vllm.engine, propagate to these)
LIBRARIES = {
    "vllm": "vllm.log",
    "ray": "ray.log",
    "transformers": "transformers.log",
    "torch": "torch.log",
    "huggingface_hub": "transformers.log",
    "filelock": "transformers.log",
    "urllib3": "transformers.log",
    "httpx": "transformers.log",
    "py.warnings": "warnings.log",
}


class _RunLogHandler(logging.Handler):
    """Routes each record to RUN/logs/<file> by the library it comes from; before the run folder exists
    (a new run makes it after the backend is built) records wait in memory, then go to the files."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        self.waiting: list[logging.LogRecord] = []
        self.files: dict[str, object] = {}
        self.logs: Path | None = None

    def attach(self, run_dir: Path) -> Path:
        self.logs = Path(run_dir) / LOGS_DIR  # made when the first record comes
        waiting, self.waiting = self.waiting, []
        for record in waiting:
            self.emit(record)
        return self.logs

    def _file(self, name: str):
        top = name
        while top not in LIBRARIES and "." in top:
            top = top.rsplit(".", 1)[0]
        filename = LIBRARIES.get(top, "other.log")
        if filename not in self.files:
            self.logs.mkdir(parents=True, exist_ok=True)
            self.files[filename] = open(self.logs / filename, "a", encoding="utf-8")  # noqa: SIM115
        return self.files[filename]

    def emit(self, record: logging.LogRecord) -> None:
        if self.logs is None:
            if len(self.waiting) < MAX_WAITING:
                self.waiting.append(record)
            return
        try:
            f = self._file(record.name)
            f.write(self.format(record) + "\n")
            f.flush()
        except Exception:  # a log line must never break a run
            self.handleError(record)

    def close(self) -> None:
        for f in self.files.values():
            f.close()
        self.files = {}
        super().close()


MAX_WAITING = 100_000  # records kept in memory before the run folder exists


class LibraryLogs:
    """What `library_logs` yields: `attach(run_dir)` once the run folder exists (None when verbose)."""

    def __init__(self, handler: _RunLogHandler | None) -> None:
        self.handler = handler

    def attach(self, run_dir: Path) -> Path | None:
        return None if self.handler is None else self.handler.attach(run_dir)


@contextlib.contextmanager
def library_logs(verbose: bool = False) -> Iterator[LibraryLogs]:
    """Send the LIBRARIES' log records to RUN/logs/ for the duration (nothing changes when verbose).

    If the block fails before a run folder was attached (a backend that cannot be built), the waiting
    records of level WARNING and up go where they would have gone without this (the console), so the
    libraries' own account of the failure is not lost."""
    if verbose:
        yield LibraryLogs(None)
        return
    handler = _RunLogHandler()
    saved = []
    env_before = os.environ.get("VLLM_CONFIGURE_LOGGING")
    if "vllm" not in sys.modules and env_before is None:
        os.environ["VLLM_CONFIGURE_LOGGING"] = "0"  # read once, when vLLM is imported
    failed = False
    try:
        for name in LIBRARIES:
            log = logging.getLogger(name)
            saved.append((log, list(log.handlers), log.propagate, log.level))
            for h in list(log.handlers):
                log.removeHandler(h)
            log.addHandler(handler)
            log.propagate = False
            if name == "vllm" and log.level == logging.NOTSET:
                log.setLevel(logging.INFO)  # vLLM's own default (VLLM_LOGGING_LEVEL); other levels stay
        logging.captureWarnings(True)
        yield LibraryLogs(handler)
    except BaseException:
        failed = True
        raise
    finally:
        logging.captureWarnings(False)
        for log, handlers, propagate, level in saved:
            log.removeHandler(handler)
            for h in handlers:
                log.addHandler(h)
            log.propagate, log.level = propagate, level
        handler.close()
        if env_before is None:
            os.environ.pop("VLLM_CONFIGURE_LOGGING", None)
        if failed and handler.logs is None:
            for record in handler.waiting:
                if record.levelno >= logging.WARNING:
                    logging.getLogger(record.name).handle(record)
