"""The libraries' own log lines (vLLM, Ray, transformers, torch, Python warnings) go to RUN/logs/, not the console.

A run's console holds rtpo's lines only: the run folder, one line (or a bar) per phase, the result.  While
a run is being built and runs, every logger named in LIBRARIES writes to RUN/logs/<file> instead (at
the level it has, vLLM's INFO lines included, with time and logger name) and stops propagating, and
the libraries' Python warnings into RUN/logs/warnings.log (rtpo's own warnings stay on the console).  What the
libraries write to stderr themselves (tqdm bars of weight loading, C++ warnings of torch and vLLM, at
the file-descriptor level, so child processes too) goes to RUN/logs/stderr.log; rtpo's own notices
during a run use `console_stderr()`, the console's stderr.  `rtpo run --verbose` leaves all of them as they
were.  vLLM configures its logger when it is first imported (a handler on stdout, unless
VLLM_CONFIGURE_LOGGING=0): a run that has not imported it yet sets that variable for its import, and
one that has gets its handlers taken off for the run and put back after.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
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
    "mlflow": "mlflow.log",
    "alembic": "mlflow.log",  # the SQLite store's schema migrations
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


RTPO_DIR = str(Path(__file__).resolve().parents[1])


def _route_warning(console_showwarning):
    """rtpo's own warnings (a sandbox without kernel isolation, ...) stay on the console; the libraries'
    go to RUN/logs/warnings.log as records of the `py.warnings` logger."""

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if str(Path(filename).resolve()).startswith(RTPO_DIR):
            return console_showwarning(message, category, filename, lineno, console_stderr(), line)
        text = warnings.formatwarning(message, category, filename, lineno, line)
        logging.getLogger("py.warnings").warning("%s", text.rstrip())

    return showwarning


_CONSOLE_STDERR: list = []  # the console's stderr while library_logs holds fd 2 (innermost last)


def console_stderr():
    """The stream rtpo's own notices go to during a run (the console's stderr, also when fd 2 is redirected)."""
    return _CONSOLE_STDERR[-1] if _CONSOLE_STDERR else sys.stderr


class _StderrCapture:
    """fd 2 (and sys.stderr) into a temporary file until the run folder exists, then RUN/logs/stderr.log."""

    def __init__(self) -> None:
        import tempfile

        sys.stderr.flush()
        self.saved_fd = os.dup(2)
        self.saved_stream = sys.stderr
        try:
            on_fd2 = self.saved_stream.fileno() == 2
        except (AttributeError, OSError, ValueError):  # a stream of its own (pytest's capsys, a notebook)
            on_fd2 = False
        # rtpo's notices: the stderr object as it was, unless it writes to fd 2 (then a copy of the old fd 2)
        self.own_console = on_fd2
        self.console = (
            open(os.dup(self.saved_fd), "w", buffering=1, encoding="utf-8", errors="replace")  # noqa: SIM115
            if on_fd2
            else self.saved_stream
        )
        self.target = tempfile.TemporaryFile()  # noqa: SIM115
        self.path: Path | None = None
        self._point(self.target.fileno())

    def _point(self, fd: int) -> None:
        sys.stderr.flush()
        os.dup2(fd, 2)
        sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115

    def attach(self, logs: Path) -> None:
        logs.mkdir(parents=True, exist_ok=True)
        self.path = logs / "stderr.log"
        f = open(self.path, "ab")  # noqa: SIM115
        sys.stderr.flush()
        self.target.seek(0)
        f.write(self.target.read())
        f.flush()
        self.target.close()
        self.target = f
        self._point(f.fileno())

    def restore(self, replay: bool) -> None:
        sys.stderr.flush()
        os.dup2(self.saved_fd, 2)
        os.close(self.saved_fd)
        sys.stderr = self.saved_stream
        if replay and self.path is None:  # no run folder: what the libraries said is the failure's account
            self.target.seek(0)
            sys.stderr.write(self.target.read().decode("utf-8", "replace"))
            sys.stderr.flush()
        self.target.close()
        if self.own_console:
            self.console.close()


class LibraryLogs:
    """What `library_logs` yields: `attach(run_dir)` once the run folder exists (None when verbose)."""

    def __init__(self, handler: _RunLogHandler | None, stderr: _StderrCapture | None = None) -> None:
        self.handler, self.stderr = handler, stderr

    def attach(self, run_dir: Path) -> Path | None:
        if self.handler is None:
            return None
        logs = self.handler.attach(run_dir)
        if self.stderr is not None:
            self.stderr.attach(logs)
        return logs


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
    mlflow_env_before = os.environ.get("MLFLOW_CONFIGURE_LOGGING")
    if "mlflow" not in sys.modules and mlflow_env_before is None:
        os.environ["MLFLOW_CONFIGURE_LOGGING"] = "false"  # else MLflow gives its logger a stderr handler on import
    failed = False
    capture = saved_showwarning = None
    try:
        capture = _StderrCapture()
        _CONSOLE_STDERR.append(capture.console)
        for name in LIBRARIES:
            log = logging.getLogger(name)
            saved.append((log, list(log.handlers), log.propagate, log.level))
            for h in list(log.handlers):
                log.removeHandler(h)
            log.addHandler(handler)
            log.propagate = False
            if name == "vllm" and log.level == logging.NOTSET:
                log.setLevel(logging.INFO)  # vLLM's own default (VLLM_LOGGING_LEVEL); other levels stay
        saved_showwarning = warnings.showwarning
        warnings.showwarning = _route_warning(saved_showwarning)
        yield LibraryLogs(handler, capture)
    except BaseException:
        failed = True
        raise
    finally:
        if capture is not None:
            _CONSOLE_STDERR.remove(capture.console)
            capture.restore(replay=failed)
        if saved_showwarning is not None:
            warnings.showwarning = saved_showwarning
        for log, handlers, propagate, level in saved:
            log.removeHandler(handler)
            for h in handlers:
                log.addHandler(h)
            log.propagate, log.level = propagate, level
        handler.close()
        if env_before is None:
            os.environ.pop("VLLM_CONFIGURE_LOGGING", None)
        if mlflow_env_before is None:
            os.environ.pop("MLFLOW_CONFIGURE_LOGGING", None)
        if failed and handler.logs is None:
            for record in handler.waiting:
                if record.levelno >= logging.WARNING:
                    logging.getLogger(record.name).handle(record)
