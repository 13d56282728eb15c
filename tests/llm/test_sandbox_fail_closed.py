"""Attack class "the sandbox fails closed": no answer files, no host sockets, limits per call, refusal.

The sandbox pivots into a root of its own that holds only the interpreter's folders and the system's
library folders (read-only), /dev basics, a fresh /proc and a private scratch tmpfs.  These tests plant
files and a unix socket on the host and check that a tool call sees none of them, also when the
interpreter lives under a mode-0700 home with HOME pointing elsewhere; that limits hold for the call as a
whole; and that without kernel isolation a call is refused unless the scenario allows it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from rtpo.llm import sandbox
from rtpo.llm.sandbox import SandboxLimits, run_python

ROOT = Path(__file__).resolve().parents[2]
FAST = SandboxLimits(wall_time_s=30.0, cpu_time_s=10)
kernel = pytest.mark.skipif(
    not (hasattr(os, "geteuid") and os.geteuid() == 0), reason="kernel isolation needs root (CI runs as root)"
)

PROBE = textwrap.dedent(
    """
    import json, os, socket, sys
    out = {"uid": os.getuid(), "euid": os.geteuid(), "root": sorted(os.listdir("/"))}
    def can_read(p):
        try:
            with open(p, "rb") as f:
                f.read(1)
            return True
        except OSError:
            return False
    out["read"] = {p: can_read(p) for p in sys.argv[1:]} if len(sys.argv) > 1 else {}
    def can_connect(addr):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(2)
        try:
            s.connect(addr)
            return True
        except OSError:
            return False
        finally:
            s.close()
    out["sockets"] = {repr(a): can_connect(a) for a in TARGET_SOCKETS}
    out["scratch_writable"] = os.access(os.getcwd(), os.W_OK)
    print(json.dumps(out))
    """
)


@pytest.fixture
def planted(tmp_path):
    """Host data a reward hacker wants (world-readable), a host unix socket and an abstract one."""
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    gold = data / "train.jsonl"
    gold.write_text('{"question": "1+1", "answer": "2"}\n')
    gold.chmod(0o644)
    tmp_path.chmod(0o755)
    path_sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path_sock.bind(str(tmp_path / "host.sock"))
    os.chmod(tmp_path / "host.sock", 0o777)
    path_sock.listen(1)
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    name = f"\0rtpo-test-{os.getpid()}"
    abstract.bind(name)
    abstract.listen(1)
    files = [str(gold), str(ROOT / "rtpo" / "llm" / "rewards.py"), str(ROOT / "README.md"), "/etc/passwd"]
    yield files, [str(tmp_path / "host.sock"), name]
    path_sock.close()
    abstract.close()


def _probe_code(files, sockets) -> str:
    return f"import sys\nsys.argv = ['main.py', *{files!r}]\nTARGET_SOCKETS = {sockets!r}\n" + PROBE


def _check(report: dict, files) -> None:
    assert report["uid"] >= sandbox._UID_BASE and report["euid"] == report["uid"]  # an unprivileged uid
    assert not any(report["read"].values()), report["read"]  # no host data, no sources, no /etc
    assert not any(report["sockets"].values()), report["sockets"]  # no host unix socket, path or abstract
    assert report["scratch_writable"]
    # The new root holds the system folders plus the first component of each interpreter folder (the venv
    # and base prefix live wherever the checkout is, e.g. /check/... on CI); nothing else of the host.
    system = {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin", "tmp", "usr"}
    interpreter = {Path(d).parts[1] for d in sandbox._interpreter_dirs()}
    assert set(report["root"]) <= system | interpreter, sorted(set(report["root"]) - system - interpreter)


@kernel
def test_a_tool_call_sees_nothing_of_the_host(planted):
    files, sockets = planted
    for f in files:
        assert open(f, "rb").read(1)  # readable on the host
    r = run_python(_probe_code(files, sockets), FAST)
    assert r.ok and r.isolation == "namespaces", (r.stderr, r.error)
    _check(json.loads(r.stdout), files)


@kernel
def test_interpreter_under_a_mode_0700_home_with_home_elsewhere(planted, tmp_path):
    """The attack that made the old sandbox fall back to no isolation: a venv under a 0700 home that the
    per-call uid cannot enter, HOME pointing elsewhere.  The call runs isolated anyway, or is refused."""
    files, sockets = planted
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    venv = home / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    script = tmp_path / "drive.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import importlib.util, json, sys
            spec = importlib.util.spec_from_file_location("sb", {str(ROOT / "rtpo" / "llm" / "sandbox.py")!r})
            sb = sys.modules["sb"] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(sb)
            r = sb.run_python(sys.stdin.read(), sb.SandboxLimits(wall_time_s=30.0, cpu_time_s=10))
            print(json.dumps({{"stdout": r.stdout, "isolation": r.isolation, "error": r.error, "exe": sys.executable}}))
            """
        )
    )
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path / "elsewhere")}
    out = subprocess.run(
        [str(venv / "bin" / "python"), str(script)],
        input=_probe_code(files, sockets),
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["exe"].startswith(str(home))
    assert res["isolation"] == "namespaces", res  # this kernel can isolate: a refusal here would be a bug
    _check(json.loads(res["stdout"]), files)


@kernel
def test_memory_is_limited_per_call_not_per_process():
    """Four children of 200 MB each: every one fits a per-process limit of 512 MB, together they do not."""
    code = textwrap.dedent(
        """
        import os
        kids = []
        for _ in range(4):
            pid = os.fork()
            if pid == 0:
                b = bytearray(200 * 1024 * 1024)
                for i in range(0, len(b), 4096):
                    b[i] = 1
                import time; time.sleep(3)
                os._exit(0)
            kids.append(pid)
        ok = sum(os.waitpid(p, 0)[1] == 0 for p in kids)
        print(ok)
        """
    )
    limits = SandboxLimits(wall_time_s=60.0, cpu_time_s=30, memory_bytes=512 * 1024 * 1024, max_processes=16)
    r = run_python(code, limits)
    survivors = int(r.stdout.strip() or 0) if r.stdout.strip().isdigit() else 0
    assert survivors < 4, (r.stdout, r.stderr)
    one = run_python(code.replace("range(4)", "range(1)"), limits)
    assert one.stdout.strip() == "1", (one.stdout, one.stderr)  # one child alone fits the call's limit


def test_without_isolation_a_call_is_refused_unless_allowed(monkeypatch):
    monkeypatch.setattr(sandbox, "_ISOLATION", ("rlimits", "test: unshare is not permitted"))
    monkeypatch.setattr(sandbox, "_WARNED", False)
    r = run_python("print('escaped')", FAST)
    assert r.isolation == "refused" and r.stdout == "" and not r.ok
    assert "test: unshare is not permitted" in r.error and "allow_unisolated" in r.error
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        r = run_python("print('ran')", SandboxLimits(wall_time_s=30.0, allow_unisolated=True))
    assert r.stdout == "ran\n" and r.isolation == "rlimits"
    assert any("WITHOUT KERNEL ISOLATION" in str(w.message) for w in seen)


def test_refusal_reaches_the_model_as_feedback_and_a_metric(monkeypatch):
    pytest.importorskip("transformers")
    from rtpo.llm import chat as chat_mod
    from rtpo.llm.env import LLMEnv
    from rtpo.llm.tasks import MathItem, MathTask

    try:
        tok = chat_mod.load_qwen3_tokenizer()
    except (ModuleNotFoundError, FileNotFoundError):
        pytest.skip("Qwen3 tokenizer files absent")
    import numpy as np

    from rtpo.core.types import Generation, Ragged

    monkeypatch.setattr(sandbox, "_ISOLATION", ("rlimits", "test: no namespaces"))
    env = LLMEnv(MathTask("t", (MathItem("a", "Compute 1 + 1.", "2", "t"),)), tok, num_turns=3)
    rng = np.random.default_rng(0)
    eps = env.reset(np.array([0]), rng)
    text = '<tool_call>\n{"name": "python", "arguments": {"code": "print(1+1)"}}\n</tool_call>'
    row = np.concatenate([env.chat.ids(text), [env.chat.im_end_id]]).astype(np.int64)
    tokens = Ragged.from_rows([row], dtype=np.int64)
    _, out = env.step(eps, Generation(tokens, Ragged(np.zeros(tokens.values.size), tokens.offsets)), rng)
    assert "refused" in out.feedback[0] and not out.done[0]
    m = env.pop_metrics()
    assert m["tool/refused"] == 1 and m["tool/ok"] == 0


def test_scenario_section_reaches_the_limits():
    pytest.importorskip("transformers")
    from rtpo.scenario.load import load_scenario

    cfg = load_scenario(ROOT / "scenarios/llm/tiny-cpu.yaml", ["task.sandbox.allow_unisolated=true"])
    lim = cfg.task.sandbox.limits()
    assert lim.allow_unisolated and lim.memory_bytes == 1024 * 1024 * 1024
    assert load_scenario(ROOT / "scenarios/llm/tiny-cpu.yaml").task.sandbox.allow_unisolated is False
