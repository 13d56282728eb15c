"""Sandbox launcher: runs as its own fresh process (`python -I -S this.py CONFIG`), isolates, then execs.

It is a separate script, not a `preexec_fn`, because the environment runs tool calls from a thread pool
and `preexec_fn` is unsafe in a threaded parent.  It imports nothing outside the standard library.

Protocol: argv[1] is a JSON config; stdin carries the program text.  Exit status: the program's own,
or 128 + signal number when the program was killed by a signal; 125 when isolation itself failed
(the reason is written to stderr).

Kernel mode ("namespaces", needs root): unshare PID, network, mount, IPC and UTS namespaces; fork a
PID 1 for the new PID namespace that stays root, mounts private tmpfs over the world-writable folders
(/tmp, /var/tmp, /dev/shm, /run/lock; the working folder lives in the /tmp one, so nothing written
persists on the host), hides the caller's home behind an empty tmpfs (binding the interpreter's own
folders back read-only), mounts a fresh /proc (host processes and their environments are invisible),
and forks the program as PID 2 under an unprivileged per-call uid/gid (RLIMIT_NPROC is not enforced
for root, and a uid of its own keeps one call's processes from counting against another's) with the
resource limits set.  When the program exits, PID 1 exits and the kernel kills whatever it left.
The network namespace has only a loopback that is down, so every connection fails in the kernel.

Fallback mode ("rlimits", not root): resource limits, a fresh session, and a socket guard installed
in Python before the program runs.  It cannot stop writes outside the folder; the parent warns.
"""

import ctypes
import json
import os
import resource
import signal
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_RDONLY = 1
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
PR_SET_PDEATHSIG = 1

_GUARD = (
    "import socket as _s\n"
    "def _deny(*a, **k):\n"
    "    raise OSError(101, 'network access is disabled in the sandbox')\n"
    "for _n in ('socket', 'create_connection', 'getaddrinfo', 'socketpair', 'fromfd', 'create_server'):\n"
    "    setattr(_s, _n, _deny)\n"
    "import runpy as _r, sys as _sys\n"
    "_sys.argv = ['main.py']\n"
    "del _s, _deny, _n\n"
    "_r.run_path('main.py', run_name='__main__')\n"
)


def _fail(msg):
    os.write(2, ("sandbox isolation failed: " + msg + "\n").encode())
    os._exit(125)


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    return libc


def _check(ret, what):
    if ret != 0:
        _fail(f"{what}: {os.strerror(ctypes.get_errno())}")


def _limits(cfg):
    lim = cfg["limits"]
    cpu = int(lim["cpu_time_s"])
    # soft CPU limit sends SIGXCPU; the hard limit one second later is SIGKILL for code that ignores it
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (lim["memory_bytes"], lim["memory_bytes"]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (lim["max_file_bytes"], lim["max_file_bytes"]))
    resource.setrlimit(resource.RLIMIT_NOFILE, (lim["max_open_files"], lim["max_open_files"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NPROC, (lim["max_processes"], lim["max_processes"]))


def _wait_and_relay(pid):
    # The parent stops a run with SIGTERM to this launcher: kill PID 1 and wait for it.  PID 1 exits only
    # after the kernel has killed and reaped every process of its namespace, so when the launcher exits
    # nothing of the run is left.
    signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGKILL))
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        os._exit(128 + os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status))


def _reap_until(main_pid):
    """PID 1's job: reap orphans until the program itself exits, then relay its status."""
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except InterruptedError:
            continue
        except ChildProcessError:
            os._exit(125)
        if pid == main_pid:
            if os.WIFSIGNALED(status):
                os._exit(128 + os.WTERMSIG(status))
            os._exit(os.WEXITSTATUS(status))


def _namespaces(cfg, code):
    libc = _libc()
    _check(libc.unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS), "unshare")
    pid = os.fork()
    if pid:
        _wait_and_relay(pid)
    # PID 1 of the new namespace from here on: it stays root, sets up the mounts, runs the program as
    # PID 2 (PID 1 ignores default-action signals such as SIGXCPU, so user code must not be PID 1) and
    # exits with its status, at which point the kernel kills whatever else the program left behind.
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    # private propagation first, so none of the mounts below leak back to the host
    _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
    # The interpreter (and its venv) must stay reachable for the unprivileged uid even when it lives
    # under a folder we hide (HOME) or overmount (/tmp): hold it by fd now, bind it back afterwards.
    keep = {}
    for path in cfg["keep"]:
        if os.path.isdir(path):
            keep[path] = os.open(path, os.O_PATH | os.O_DIRECTORY)
    size = f"size={int(cfg['limits']['tmpfs_bytes'])},mode=1777".encode()
    covered = []
    # every world-writable folder of a usual Linux (the per-call uid owns nothing, so these are the only
    # places it could write); a symlink (/var/lock -> /run/lock) is covered through its target
    for target in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/var/lock", "/run/shm"):
        if os.path.isdir(target) and not os.path.islink(target):
            _check(libc.mount(b"tmpfs", target.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, size), f"tmpfs on {target}")
            covered.append(target)
    for home in cfg["hide"]:
        # the parent's home (keys, tokens, caches) is replaced by an empty, read-only-to-others folder
        if home not in ("/", "") and os.path.isdir(home) and not any(home.startswith(c + "/") for c in covered):
            _check(
                libc.mount(b"tmpfs", home.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=1m,mode=0755"),
                f"tmpfs on {home}",
            )
            covered.append(home)
    for path, fd in keep.items():
        if any(path == c or path.startswith(c + "/") for c in covered):
            os.makedirs(path, mode=0o755, exist_ok=True)
            _check(
                libc.mount(f"/proc/self/fd/{fd}".encode(), path.encode(), None, MS_BIND | MS_REC, None), f"bind {path}"
            )
            _check(libc.mount(None, path.encode(), None, MS_REMOUNT | MS_BIND | MS_RDONLY, None), f"read-only {path}")
        os.close(fd)
    # a fresh /proc shows only this namespace (host processes and their environ stay hidden)
    if libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None) != 0:
        _fail("mount /proc: " + os.strerror(ctypes.get_errno()))
    work = "/tmp/work"
    os.mkdir(work, 0o700)
    with open(os.path.join(work, "main.py"), "wb") as f:
        f.write(code)
    uid, gid = int(cfg["uid"]), int(cfg["gid"])
    os.chown(work, uid, gid)
    os.chown(os.path.join(work, "main.py"), uid, gid)
    os.chdir(work)
    child = os.fork()
    if child:
        _reap_until(child)
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getuid() != uid or os.geteuid() != uid:
        _fail("could not drop privileges")
    _limits(cfg)
    python = cfg["python"]
    if not os.access(python, os.X_OK):
        python = cfg["fallback_python"]
    env = dict(cfg["env"], HOME=work, TMPDIR=work, PWD=work)
    os.execve(python, [python, "-I", "-u", "main.py"], env)  # -u: output before a kill survives


def _rlimits_only(cfg, code):
    work = cfg["workdir"]
    with open(os.path.join(work, "main.py"), "wb") as f:
        f.write(code)
    os.chdir(work)
    _limits(cfg)
    env = dict(cfg["env"], HOME=work, TMPDIR=work, PWD=work)
    python = cfg["python"]
    os.execve(python, [python, "-I", "-u", "-c", _GUARD], env)


def main():
    cfg = json.loads(sys.argv[1])
    code = sys.stdin.buffer.read()
    # the program gets an empty stdin, never the launcher's pipe
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    if cfg["mode"] == "namespaces":
        _namespaces(cfg, code)
    else:
        _rlimits_only(cfg, code)


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001 - any failure to isolate must be a status, not a traceback
        _fail(f"{type(e).__name__}: {e}")
