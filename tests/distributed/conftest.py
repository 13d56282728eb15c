"""One local Ray cluster per test module (2 CPUs), shut down afterwards with a check that nothing survives."""

import os
import time

import pytest


def ray_processes(session_dir: str) -> list[str]:
    """Command lines of live processes that belong to this Ray session (raylet, gcs_server, workers)."""
    name = os.path.basename(session_dir.rstrip("/"))
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if name in cmd:
            found.append(f"{pid}: {cmd[:120]}")
    return found


def wait_until_gone(session_dir: str, timeout_s: float = 20.0) -> list[str]:
    deadline = time.monotonic() + timeout_s
    left = ray_processes(session_dir)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = ray_processes(session_dir)
    return left


@pytest.fixture(scope="session")
def ray_cluster():
    """One 2-CPU local cluster for all distributed tests (each start costs seconds on 2 cores)."""
    ray = pytest.importorskip("ray", reason="the distributed extra (ray) is not installed")
    from rtpo.distributed import init_ray

    if not init_ray(num_cpus=2):
        pytest.fail("a Ray session was already running in this process; the tests need their own")
    session_dir = ray._private.worker._global_node.get_session_dir_path()
    running = ray_processes(session_dir)
    # the survivor check below can see this session's processes, so an empty list there means something
    assert any("raylet" in p for p in running) and any("gcs_server" in p for p in running), running
    yield session_dir
    ray.shutdown()
    left = wait_until_gone(session_dir)
    assert not left, f"Ray processes survived ray.shutdown(): {left}"
