"""Sandbox launcher: runs as its own fresh process (`python -I -S this.py CONFIG`), isolates, then execs.

It is a separate script, not a `preexec_fn`, because the environment runs tool calls from a thread pool
and `preexec_fn` is unsafe in a threaded parent.  It imports nothing outside the standard library.

Protocol: argv[1] is a JSON config; stdin carries the program text.  Exit status: the program's own,
or 128 + signal number when the program was killed by a signal; 125 when isolation itself failed
(the reason is written to stderr).

Kernel mode ("namespaces", needs root): join cgroups of the call's own, nested under the caller's own
cgroups (so the job's limits hold for its tool calls too; memory and pids: the limits hold for the call
as a whole, however many processes it forks; without a writable cgroup hierarchy the
memory limit is split over max_processes as RLIMIT_AS per process), unshare PID, network, mount, IPC and
UTS namespaces, and fork a PID 1 for the new PID namespace that stays root and builds a root of its own on
a tmpfs: the system's library folders (/usr, /lib...) and the interpreter's own folders (its venv and
base prefix, wherever they live; a mode-0700 home above them is no obstacle) bind-mounted read-only, a
/dev with null/zero/full/random/urandom, a fresh /proc, and a private scratch tmpfs at /tmp holding the
working folder.  It pivots into that root and detaches the old one, so nothing else of the host exists
for the program: no data (training files with gold answers), no sources (reward code), no home, no unix
sockets (abstract ones belong to the new network namespace).  The program runs as PID 2 under a fresh
unprivileged per-call uid/gid with resource limits.  When it exits, PID 1 exits and the kernel kills
whatever it left.  The network namespace has only a loopback that is down.

Fallback mode ("rlimits"): resource limits, a fresh session, and a socket guard installed in Python
before the program runs.  It cannot stop reads or writes outside the folder, so rtpo.llm.sandbox runs it
only when the scenario says `task.sandbox.allow_unisolated: true`; otherwise the call is refused.
"""

import ctypes
import json
import os
import resource
import signal
import sys
import time

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
    libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
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


# The launcher's own stop request (SIGTERM: from the caller's _stop, or the parent-death signal when the
# caller dies): kill PID 1 once it exists, and remember the request when it comes before.
_STOP = {"pid": None, "requested": False}


def _on_stop(*_):
    _STOP["requested"] = True
    if _STOP["pid"]:
        os.kill(_STOP["pid"], signal.SIGKILL)


def _wait_and_relay(cfg, pid):
    # The parent stops a run with SIGTERM to this launcher, and the kernel sends the same when the caller
    # dies (PR_SET_PDEATHSIG, set in main): kill PID 1 and wait for it.  PID 1 exits only after the kernel
    # has killed and reaped every process of its namespace, so when the launcher exits nothing of the run
    # is left; it removes the call's cgroups on its way out, since a dead caller cannot.  The launcher also
    # enforces the wall limit itself (SIGALRM a second after it: the caller's own deadline comes first and
    # reports it), so a caller that stops watching cannot leave a program running.
    _STOP["pid"] = pid
    if _STOP["requested"]:
        os.kill(pid, signal.SIGKILL)
    wall_time_s = cfg.get("wall_time_s")
    if wall_time_s:
        signal.signal(signal.SIGALRM, lambda *_: os.kill(pid, signal.SIGKILL))
        signal.alarm(int(wall_time_s) + 2)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    _leave_cgroups()
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


# what the interpreter needs from the operating system, seen read-only inside the sandbox's root
_SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin")
_SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/localtime")
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
_ROOT = "/tmp"  # the new root is a tmpfs mounted here (in this mount namespace only), then pivoted into
MNT_DETACH = 2
SYS_PIVOT_ROOT = 155  # x86_64


def _enter_cgroups(cfg):
    """Put this process (and so every process of the call) into cgroups of its own with the call's memory
    and process limits, when the host offers a writable memory and pids hierarchy (v1 or v2).  Returns
    the scope of the limits: "cgroup" (per call) or "process" (RLIMIT_AS per process, see _limits)."""
    name = f"rtpo-sandbox-{int(cfg['uid'])}"
    lim = cfg["limits"]
    pid = str(os.getpid())
    parents = cfg.get("cgroup_parents") or {}  # the caller's own cgroups: the call's nest under them
    made = _CGROUPS
    v2 = parents.get("v2", "/sys/fs/cgroup")
    try:
        if os.path.exists(v2 + "/cgroup.controllers"):
            ctrl = open(v2 + "/cgroup.controllers").read().split()
            if "memory" in ctrl and "pids" in ctrl:
                d = os.path.join(v2, name)
                os.mkdir(d)
                made.append((os.open(v2, os.O_RDONLY | os.O_DIRECTORY), name))
                _write(d + "/memory.max", lim["memory_bytes"])
                _write(d + "/memory.swap.max", 0, required=False)
                _write(d + "/pids.max", lim["max_processes"])
                _write(d + "/cgroup.procs", pid)
                return "cgroup"
        mem = parents.get("memory", "/sys/fs/cgroup/memory")
        pids = parents.get("pids", "/sys/fs/cgroup/pids")
        if os.path.isdir(mem) and os.path.isdir(pids):
            dm, dp = os.path.join(mem, name), os.path.join(pids, name)
            os.mkdir(dm)
            made.append((os.open(mem, os.O_RDONLY | os.O_DIRECTORY), name))
            os.mkdir(dp)
            made.append((os.open(pids, os.O_RDONLY | os.O_DIRECTORY), name))
            _write(dm + "/memory.limit_in_bytes", lim["memory_bytes"])
            _write(dm + "/memory.memsw.limit_in_bytes", lim["memory_bytes"], required=False)
            _write(dp + "/pids.max", lim["max_processes"])
            _write(dm + "/cgroup.procs", pid)
            _write(dp + "/cgroup.procs", pid)
            return "cgroup"
    except OSError:
        pass
    return "process"


# (fd of the parent, name) of each cgroup this launcher made, removed by _leave_cgroups.  By fd, because
# PID 1's pivot_root takes the host's file system away from the launcher too (they share the mount
# namespace).  The fds are close-on-exec, so the program never holds one.
_CGROUPS = []


def _leave_cgroups():
    """Move the launcher back to the caller's cgroups and remove the call's own: they are empty once PID 1
    is reaped.  The caller removes them too (rtpo.llm.sandbox._remove_cgroups), unless it died."""
    for parent, _ in _CGROUPS:
        try:
            fd = os.open("cgroup.procs", os.O_WRONLY, dir_fd=parent)
            try:
                os.write(fd, str(os.getpid()).encode())
            finally:
                os.close(fd)
        except OSError:
            pass
    for parent, name in _CGROUPS:
        for _ in range(100):  # the kernel may take a moment to release a just-emptied cgroup
            try:
                os.rmdir(name, dir_fd=parent)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.01)


def _write(path, value, required=True):
    try:
        with open(path, "w") as f:
            f.write(str(value))
    except OSError:
        if required:
            raise


def _bind(libc, fd, target, file=False):
    if file:
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        open(target, "a").close()
    else:
        os.makedirs(target, mode=0o755, exist_ok=True)
    _check(libc.mount(f"/proc/self/fd/{fd}".encode(), target.encode(), None, MS_BIND | MS_REC, None), f"bind {target}")
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID
    _check(libc.mount(None, target.encode(), None, flags, None), f"read-only {target}")


def _namespaces(cfg, code):
    libc = _libc()
    _check(libc.unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS), "unshare")
    pid = os.fork()
    if pid:
        _wait_and_relay(cfg, pid)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # PID 1 of the new namespace from here on: it stays root, builds the sandbox's root, runs the program
    # as PID 2 (PID 1 ignores default-action signals such as SIGXCPU, so user code must not be PID 1) and
    # exits with its status, at which point the kernel kills whatever else the program left behind.
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    # private propagation first, so none of the mounts below leak back to the host
    _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
    # Everything the program may see, held by fd before the new root covers the paths: the interpreter's
    # own folders (its venv, wherever it lives: a mode-0700 home is no obstacle, since the new root's
    # parents of it are fresh 0755 folders), the system's library folders, a few files and devices.
    # Nothing else of the host exists in the new root: no data, no sources, no home, no sockets.
    dirs, links, files = {}, {}, {}
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):
            links[path] = os.readlink(path)
        elif os.path.isdir(path):
            dirs[path] = os.open(path, os.O_PATH | os.O_DIRECTORY)
    for path in cfg["keep"]:
        if os.path.isdir(path) and not any(path == d or path.startswith(d + "/") for d in dirs):
            dirs[path] = os.open(path, os.O_PATH | os.O_DIRECTORY)
    for path in (*_SYSTEM_FILES, *_DEVICES):
        if os.path.exists(path):
            files[path] = os.open(path, os.O_PATH)
    root = _ROOT
    _check(libc.mount(b"tmpfs", root.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=1m,mode=0755"), "tmpfs root")
    # the scratch tmpfs first: an interpreter that itself lives under /tmp is bound on top of it
    size = f"size={int(cfg['limits']['tmpfs_bytes'])},mode=1777".encode()
    scratch = root + "/tmp"
    os.mkdir(scratch, 0o755)
    _check(libc.mount(b"tmpfs", scratch.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, size), "tmpfs scratch")
    for path, fd in sorted(dirs.items()):
        _bind(libc, fd, root + path)
        os.close(fd)
    for path, target in links.items():
        os.symlink(target, root + path)
    dev = root + "/dev"
    os.mkdir(dev, 0o755)
    _check(libc.mount(b"tmpfs", dev.encode(), b"tmpfs", MS_NOSUID, b"size=64k,mode=0755"), "tmpfs /dev")
    for path, fd in files.items():
        _bind(libc, fd, root + path, file=True)
        os.close(fd)
    os.symlink("/tmp", dev + "/shm")
    os.mkdir(root + "/proc", 0o555)
    # pivot into the new root and drop the old one: the host's file system is gone for this namespace
    os.chdir(root)
    os.mkdir(".old", 0o700)
    libc.syscall.restype = ctypes.c_long
    _check(libc.syscall(SYS_PIVOT_ROOT, b".", b".old"), "pivot_root")
    os.chdir("/")
    _check(libc.umount2(b"/.old", MNT_DETACH), "detach the old root")
    os.rmdir("/.old")
    _check(libc.mount(None, b"/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, None), "read-only /")
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
    if not os.access(python, os.X_OK):
        _fail(f"the interpreter {python} is not reachable inside the sandbox")
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
    if cfg.get("wall_time_s"):  # an alarm survives execve: the program ends at the wall limit on its own
        signal.alarm(int(cfg["wall_time_s"]) + 2)
    os.execve(python, [python, "-I", "-u", "-c", _GUARD], env)  # PDEATHSIG survives execve too


def _die_with_parent(cfg, sig):
    """Send this launcher `sig` when the thread that started it ends, which for rtpo.llm.sandbox is never
    before the call ends (run_python forks and waits in the same thread) unless the caller itself dies,
    SIGKILL included.  A caller that died before this line is noticed by the parent pid having changed.
    Namespaces mode asks for SIGTERM, which the launcher (root, out of the program's reach) catches to kill
    PID 1 and remove the call's cgroups; in rlimits mode the launcher becomes the program, which could
    ignore SIGTERM, so it asks for SIGKILL."""
    _libc().prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    parent = cfg.get("parent_pid")
    if parent is not None and os.getppid() != parent:
        os._exit(125)


def main():
    cfg = json.loads(sys.argv[1])
    if cfg["mode"] == "namespaces":
        signal.signal(signal.SIGTERM, _on_stop)
        _die_with_parent(cfg, signal.SIGTERM)
    else:
        _die_with_parent(cfg, signal.SIGKILL)
    code = sys.stdin.buffer.read()
    # the program gets an empty stdin, never the launcher's pipe
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    if cfg["mode"] == "namespaces":
        scope = _enter_cgroups(cfg)  # before unshare: cgroup.procs takes host pids
        if _STOP["requested"]:  # stopped (or orphaned) before the program ever ran
            _leave_cgroups()
            os._exit(128 + signal.SIGTERM)
        if scope == "process":  # no per-call cgroup: split the call's memory over its processes
            lim = cfg["limits"]
            lim["memory_bytes"] = max(lim["memory_bytes"] // lim["max_processes"], 1)
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
