"""Sandboxed Python execution for the model's tool calls: one subprocess per call, limited, isolated.

`run_python(code, limits)` never raises on bad code: syntax errors, crashes, bombs and timeouts are all
a `SandboxResult`.  Isolation is done in the kernel where the process may (root, as on this project's
machines and CI): per-call cgroups, new PID/network/mount namespaces, a pivot into a root that holds only
the interpreter and the system libraries read-only plus a private scratch tmpfs, a fresh /proc, an
unprivileged per-call uid, resource limits (see `_sandbox_launcher.py`).  It fails closed: where that
isolation cannot be set up, a call is refused (`SandboxResult.isolation == "refused"`, the error names
the real cause) unless `SandboxLimits.allow_unisolated` (scenario: `task.sandbox.allow_unisolated`) says
to run it with resource limits and a Python socket guard only, which is warned about loudly and counted.
"""

from __future__ import annotations

import json
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

_LAUNCHER = str(Path(__file__).with_name("_sandbox_launcher.py"))
_UID_BASE = 1_900_000_000  # far above any real account; one fresh uid per call
_MiB = 1 << 20


@dataclass(frozen=True)
class SandboxLimits:
    """Per-call limits.

    wall_time_s:      wall-clock budget; the whole process tree is killed when it runs out.
    cpu_time_s:       RLIMIT_CPU (seconds of CPU).
    memory_bytes:     memory of the whole call: a cgroup of its own where the host offers one (every process
                      it forks counts against the one limit), and RLIMIT_AS per process as well; without a
                      cgroup, RLIMIT_AS = memory_bytes / max_processes per process, so the product of
                      process count and per-process limit is still the call's limit.
    max_processes:    the call's processes and threads (its cgroup's pids.max, and RLIMIT_NPROC of the
                      fresh per-call uid).
    max_file_bytes:   RLIMIT_FSIZE, the largest file it may write.
    tmpfs_bytes:      size of the private /tmp (kernel mode): all files it writes together.
    max_output_bytes: stdout and stderr kept, each; past this the run is stopped and marked truncated.
    max_open_files:   RLIMIT_NOFILE.
    allow_unisolated: where kernel isolation cannot be set up, run tool calls with resource limits and a
                      Python socket guard only (logged loudly, counted as tool/unisolated); by default
                      such calls are refused (fail closed).
    """

    wall_time_s: float = 10.0
    cpu_time_s: int = 5
    memory_bytes: int = 1024 * _MiB
    max_processes: int = 32
    max_file_bytes: int = 16 * _MiB
    tmpfs_bytes: int = 64 * _MiB
    max_output_bytes: int = 64 * 1024
    max_open_files: int = 64
    allow_unisolated: bool = False

    def __post_init__(self) -> None:
        for name in (
            "wall_time_s",
            "cpu_time_s",
            "memory_bytes",
            "max_processes",
            "max_file_bytes",
            "tmpfs_bytes",
            "max_output_bytes",
            "max_open_files",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"SandboxLimits.{name} must be positive, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class SandboxResult:
    """What one call produced.

    stdout, stderr: decoded as UTF-8 with undecodable bytes replaced (binary output never raises).
    exit_code:  the program's exit status, None when it was killed by a signal.
    signal:     the signal that killed it, else None.
    timed_out:  the wall-time limit ran out.
    truncated:  stdout or stderr exceeded max_output_bytes (the run was stopped there).
    limits_hit: names among wall_time, cpu_time, memory, processes, file_size, output.
    isolation:  "namespaces" (kernel) or "rlimits" (fallback).
    """

    stdout: str
    stderr: str
    exit_code: int | None
    signal: int | None
    timed_out: bool
    truncated: bool
    limits_hit: tuple[str, ...]
    wall_time_s: float
    isolation: str
    error: str | None = field(default=None)  # the sandbox itself failed (not the program)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.truncated and self.error is None


_ISOLATION: tuple[str, str] | None = None  # (mode, why kernel isolation is unavailable)


def isolation_mode() -> str:
    """'namespaces' when kernel isolation works here (root, unshare, pivot_root), else 'rlimits'."""
    return _probe_isolation()[0]


def isolation_problem() -> str:
    """Why kernel isolation is unavailable ('' when it works): the real cause, as the probe saw it."""
    return _probe_isolation()[1]


def _probe_isolation() -> tuple[str, str]:
    global _ISOLATION
    if _ISOLATION is None:
        if not sys.platform.startswith("linux"):
            _ISOLATION = ("rlimits", f"kernel isolation needs Linux, this is {sys.platform}")
        elif not hasattr(os, "geteuid") or os.geteuid() != 0:
            _ISOLATION = ("rlimits", "kernel isolation needs root (namespaces, mounts, a per-call uid)")
        else:
            probe = _run("print('ok')", SandboxLimits(wall_time_s=20.0), "namespaces")
            if probe.exit_code == 0 and probe.stdout.strip() == "ok":
                _ISOLATION = ("namespaces", "")
            else:
                cause = probe.error or (probe.stderr.strip().splitlines() or [f"exit status {probe.exit_code}"])[-1]
                _ISOLATION = ("rlimits", f"the isolated probe failed: {cause[:300]}")
    return _ISOLATION


def _not_run(isolation: str, error: str, wall_time_s: float = 0.0) -> SandboxResult:
    """A call whose program never ran: the sandbox refused it or could not start."""
    return SandboxResult("", "", None, None, False, False, (), wall_time_s, isolation, error=error)


def _refused(why: str) -> SandboxResult:
    return _not_run(
        "refused",
        f"kernel isolation is unavailable ({why}); the tool call was refused "
        "(sandbox.allow_unisolated: true runs it with resource limits only)",
    )


def _scrubbed_env() -> dict[str, str]:
    # nothing from the parent's environment passes: secrets (tokens, keys) never reach model code
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def _interpreter_dirs() -> list[str]:
    """Folders the sandboxed interpreter needs (its prefix, its venv), outermost only."""
    dirs = {
        os.path.realpath(p)
        for p in (
            sys.prefix,
            sys.base_prefix,
            os.path.dirname(sys.executable),
            os.path.dirname(os.path.realpath(sys.executable)),
        )
    }
    return sorted(d for d in dirs if not any(d.startswith(o + "/") for o in dirs if o != d))


def run_python(code: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run `code` as a fresh Python program under `limits`; never raises on what the code does."""
    limits = limits or SandboxLimits()
    mode, why = _probe_isolation()
    if mode != "namespaces":
        if not limits.allow_unisolated:
            return _refused(why)
        _warn_unisolated(why)
    return _run(code, limits, mode)


_WARNED = False


def _warn_unisolated(why: str) -> None:
    global _WARNED
    if not _WARNED:
        _WARNED = True
        warnings.warn(
            f"sandbox: RUNNING TOOL CALLS WITHOUT KERNEL ISOLATION ({why}) because sandbox.allow_unisolated is "
            "true: resource limits and a Python socket guard only; model code can read and write this "
            "machine's files",
            RuntimeWarning,
            stacklevel=3,
        )


def _run(code: str, limits: SandboxLimits, mode: str) -> SandboxResult:
    start = time.monotonic()
    uid = _UID_BASE + secrets.randbelow(100_000_000)
    workdir = None if mode == "namespaces" else tempfile.mkdtemp(prefix="rtpo-sandbox-")
    cfg = {
        "mode": mode,
        "uid": uid,
        "gid": uid,
        "workdir": workdir,
        "python": sys.executable,
        "fallback_python": getattr(sys, "_base_executable", sys.executable),
        "env": _scrubbed_env(),
        "keep": _interpreter_dirs(),
        "hide": [os.path.expanduser("~")],
        "parent_pid": os.getpid(),  # the launcher dies with this process (PR_SET_PDEATHSIG)
        "cgroup_parents": cgroup_parents(),  # per-call cgroups nest under this process's own
        "wall_time_s": float(limits.wall_time_s),  # and enforces the wall limit itself
        "limits": {
            "cpu_time_s": int(limits.cpu_time_s),
            "memory_bytes": int(limits.memory_bytes),
            "max_processes": int(limits.max_processes),
            "max_file_bytes": int(limits.max_file_bytes),
            "tmpfs_bytes": int(limits.tmpfs_bytes),
            "max_open_files": int(limits.max_open_files),
        },
    }
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", _LAUNCHER, json.dumps(cfg)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_scrubbed_env(),
            start_new_session=True,
            close_fds=True,
        )
    except OSError as e:
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)
        return _not_run(mode, f"could not start the sandbox: {e}", time.monotonic() - start)
    try:
        out, err, timed_out, truncated = _communicate(proc, code.encode("utf-8", "surrogatepass"), limits, start)
    finally:
        _stop(proc, mode)
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)
        _remove_cgroups(uid)
    rc = proc.returncode
    sig = None
    exit_code: int | None = rc
    if rc is not None and rc < 0:  # the launcher itself was killed (our timeout / output cap)
        sig, exit_code = -rc, None
    elif rc is not None and rc > 128 and rc - 128 < signal.NSIG:
        sig, exit_code = rc - 128, None
    error = None
    stderr = err.decode("utf-8", "replace")
    if rc == 125 and stderr.startswith("sandbox isolation failed"):
        error = stderr.strip().splitlines()[0]
    hit = _limits_hit(stderr, sig, timed_out, truncated)
    return SandboxResult(
        stdout=out.decode("utf-8", "replace"),
        stderr=stderr,
        exit_code=exit_code,
        signal=sig,
        timed_out=timed_out,
        truncated=truncated,
        limits_hit=hit,
        wall_time_s=time.monotonic() - start,
        isolation=mode,
        error=error,
    )


def cgroup_parents() -> dict[str, str]:
    """Where a call's cgroups go: under this process's own cgroup of each hierarchy (/proc/self/cgroup),
    not at the hierarchy's root, so a tool call's memory and processes count against the job's own limits.
    {"v2": path} for the unified hierarchy, {"memory": path, "pids": path} for v1 controllers."""
    root, out = "/sys/fs/cgroup", {}
    try:
        lines = open("/proc/self/cgroup").read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        _, ctrls, path = line.split(":", 2)
        rel = path.lstrip("/")
        if ctrls == "":
            out["v2"] = os.path.join(root, rel) if rel else root
        for c in ("memory", "pids"):
            if c in ctrls.split(","):
                out[c] = os.path.join(root, c, rel) if rel else os.path.join(root, c)
    return out


def _remove_cgroups(uid: int) -> None:
    """The launcher puts each call in cgroups named after its uid (v2, or v1 memory + pids) under the
    caller's own (cgroup_parents); once every process of the call is gone they are empty and are removed."""
    name = f"rtpo-sandbox-{uid}"
    parents = {*cgroup_parents().values(), "/sys/fs/cgroup", "/sys/fs/cgroup/memory", "/sys/fs/cgroup/pids"}
    for parent in parents:
        path = os.path.join(parent, name)
        if os.path.isdir(path):
            for _ in range(50):  # the kernel may take a moment to release a just-emptied cgroup
                try:
                    os.rmdir(path)
                    break
                except OSError:
                    time.sleep(0.01)


def _communicate(proc: subprocess.Popen, code: bytes, limits: SandboxLimits, start: float):
    """Feed the program, read both streams up to the cap, stop at the wall deadline. No unbounded buffer."""
    cap = limits.max_output_bytes
    deadline = start + limits.wall_time_s
    bufs = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    timed_out = truncated = False
    try:
        proc.stdin.write(code)
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass
    sel = selectors.DefaultSelector()
    for f in bufs:
        os.set_blocking(f.fileno(), False)
        sel.register(f, selectors.EVENT_READ)
    try:
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            for key, _ in sel.select(timeout=min(left, 0.5)):
                try:
                    chunk = os.read(key.fileobj.fileno(), 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buf = bufs[key.fileobj]
                room = cap - len(buf)
                buf += chunk[: max(room, 0)]
                if len(chunk) > room:
                    truncated = True
            if truncated:
                break
        # both pipes closed: the program is done, but give the launcher a moment to report its status
        if not timed_out and not truncated:
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                timed_out = True
    finally:
        sel.close()
        proc.stdout.close()
        proc.stderr.close()
    return bytes(bufs[proc.stdout]), bytes(bufs[proc.stderr]), timed_out, truncated


def _stop(proc: subprocess.Popen, mode: str) -> None:
    """End the run and return only when none of its processes is left."""
    if mode == "namespaces" and proc.poll() is None:
        # the launcher kills PID 1 and waits for the namespace to empty (see _sandbox_launcher)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            pass
    if proc.returncode is None:
        # the launcher leads its own session and is not reaped yet, so its pid (the group id) cannot
        # have been reused; in fallback mode this also takes the program's children that stayed in it
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()


def _limits_hit(stderr: str, sig: int | None, timed_out: bool, truncated: bool) -> tuple[str, ...]:
    hit = []
    if timed_out:
        hit.append("wall_time")
    if sig in (signal.SIGXCPU,) or (sig == signal.SIGKILL and not timed_out and not truncated):
        hit.append("cpu_time")
    tail = stderr[-4000:]
    if "MemoryError" in tail or "Cannot allocate memory" in tail:
        hit.append("memory")
    if "Resource temporarily unavailable" in tail and ("fork" in tail or "spawn" in tail or "thread" in tail):
        hit.append("processes")
    if sig == signal.SIGXFSZ or "File too large" in tail or "No space left on device" in tail:
        hit.append("file_size")
    if truncated:
        hit.append("output")
    return tuple(hit)
