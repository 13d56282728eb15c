"""In-process callers that run with one torch thread (rtpo compare's sequential jobs, rtpo verify's report
figures) put the caller's thread count back: a later computation in the same process (a test session, a
library user) sums floats the way it would have."""

from __future__ import annotations

import torch

from rtpo.compare import runner
from rtpo.verify import report


def test_compare_jobs_and_verify_figures_restore_the_thread_count(monkeypatch):
    # an in-process vLLM CPU engine replaces torch.set_num_threads with a no-op for the rest of the process
    # (vllm/v1/worker/cpu_worker.py); an earlier test in the session may have started one, so this test
    # puts torch's own function back for its duration
    monkeypatch.setattr(torch, "set_num_threads", torch._C.set_num_threads)
    before = torch.get_num_threads()
    mine = 3 if before != 3 else 2
    torch.set_num_threads(mine)
    seen: list[int] = []
    try:
        monkeypatch.setattr(runner, "run_job", lambda job: seen.append(torch.get_num_threads()) or runner.Outcome(job))
        runner.run_all([object(), object()], 1, lambda outcomes: None)
        assert seen == [1, 1] and torch.get_num_threads() == mine
        for name in ("_t1", "_t2", "_t3", "_is"):
            monkeypatch.setattr(report, name, lambda name=name: {name: str(torch.get_num_threads())})
        for name in ("_t2c", "_mm1", "_cs1"):
            monkeypatch.setattr(report, name, lambda: str(torch.get_num_threads()))
        figures = report.figures()
        assert set(figures.values()) == {"1"} and torch.get_num_threads() == mine
    finally:
        torch.set_num_threads(before)
