"""LLM checkpoints through torch.distributed.checkpoint (DCP): every rank writes its shard, no gather.

    RUN/ckpt/iter_N/learner-<k>/.metadata, __<rank>_0.distcp    model + AdamW state, tied weights once
    RUN/ckpt/iter_N/state.ckpt                                 sampler, rng, budget, progress, shard sizes

The run is scenarios/llm/tiny-cpu.yaml shrunk (HF engine, the 512-token BPE, K = 2, 2 iterations, a
learning rate that moves the weights).  Checked here: the bytes on disk are the weights and AdamW's two
moments (≤ 1.1×) with no second copy of the weights for the sampler between iterations; a resumed run
equals an unbroken one (metrics and the final weights bit for bit); real SIGKILLs inside a DCP write
(shards on disk but no .metadata; everything on disk but state.ckpt not) leave the previous checkpoint
loadable and the resume exact; a truncated shard and a foreign checkpoint are refused in one line; a
run written in the older format (pickled full state dicts) still resumes; and a 2-rank gloo run writes
one shard per rank and resumes exactly (slow: two processes per run).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from rtpo.commands import cli
from rtpo.core.metrics import reproducible
from rtpo.rundir import checkpoint

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "scenarios" / "llm" / "tiny-cpu.yaml"

pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")

SMALL = [
    "backend.engine=hf",
    "backend.tiny_tokenizer=bpe512",
    "task.num_turns=2",
    "backend.max_tokens=6",
    "task.eval_queries=2",
    "train.lr=0.01",
    "logging.keep_last=null",
    "logging.plot=false",
    "eval.every=2",  # after every iteration, so a finished 1-iteration run's lines are a 2-iteration run's
]


MODELS: list[Path] = []  # one model cache for the module: every run starts from the same model folder


def _args(tmp: Path, iterations: int, extra=()) -> list[str]:
    return [
        "run",
        str(SCENARIO),
        *SMALL,
        *extra,
        f"budget.iterations={iterations}",
        f"backend.model_cache={MODELS[0] if MODELS else tmp.parent / 'models'}",
        "--out",
        str(tmp),
        "--no-progress",
    ]


def _only_run(out: Path) -> Path:
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return run_dir


def _untimed(run_dir: Path) -> list[dict]:
    """The metric lines without wall-clock figures (rtpo.core.metrics.wall_clock: time/*, seconds, rates per second)."""
    return [reproducible(m) for m in checkpoint.read_metrics(run_dir)]


def _diff(a: list[dict], b: list[dict]) -> list:
    """(line, key, a, b) of every metric that differs: empty when the runs agree."""
    out = [("lines", len(a), len(b))] if len(a) != len(b) else []
    for i, (x, y) in enumerate(zip(a, b)):
        out += [(i, k, x.get(k), y.get(k)) for k in sorted(set(x) | set(y)) if x.get(k) != y.get(k)]
    return out


def _generations(run_dir: Path) -> dict[str, str]:
    folder = run_dir / checkpoint.GENERATIONS_DIR
    return {p.name: p.read_text() for p in sorted(folder.iterdir())}


def _weights(run_dir: Path, name: str | None = None) -> dict[str, torch.Tensor]:
    path = checkpoint.latest_path(run_dir) if name is None else run_dir / checkpoint.CKPT_DIR / name / checkpoint.STATE
    return checkpoint.model_weights(path, checkpoint.read_checkpoint(path))


def _same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """An unbroken 2-iteration run, and a 1-iteration run of the same scenario."""
    root = tmp_path_factory.mktemp("dcp")
    MODELS[:] = [root / "models"]
    out = {}
    for name, iterations in (("two", 2), ("one", 1)):
        assert cli.main(_args(root / name, iterations)) == 0
        out[name] = _only_run(root / name)
    return out


def test_layout_and_bytes_on_disk(runs):
    from rtpo.llm.build import _model_dir
    from rtpo.llm.model import load_hf_model
    from rtpo.scenario.load import load_scenario

    run = runs["two"]
    for n in (1, 2):
        folder = run / checkpoint.CKPT_DIR / f"iter_{n}"
        assert sorted(p.name for p in folder.iterdir()) == ["learner-1", "state.ckpt"]
        assert sorted(p.name for p in (folder / "learner-1").iterdir()) == [".metadata", "__0_0.distcp"]
        state = checkpoint.read_checkpoint(folder / "state.ckpt")
        assert state["learner"]["format"] == "torch-dcp" and state["learner"]["tied"] == {
            "lm_head.weight": "model.embed_tokens.weight"
        }
        assert isinstance(state["sampler"], str)  # between iterations: no second copy of the weights
    model = load_hf_model(_model_dir(load_scenario(run / checkpoint.CONFIG)))
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())  # tied: counted once
    optim_bytes = 2 * weight_bytes  # AdamW's exp_avg and exp_avg_sq
    on_disk = sum(p.stat().st_size for p in (run / checkpoint.CKPT_DIR / "iter_2").rglob("*") if p.is_file())
    assert weight_bytes + optim_bytes <= on_disk <= 1.1 * (weight_bytes + optim_bytes)
    w = _weights(run)
    assert w["lm_head.weight"] is w["model.embed_tokens.weight"]
    assert not _same_weights(w, _weights(run, "iter_1"))  # training moved them


def test_resume_with_a_larger_budget_is_exact(runs, tmp_path):
    run = tmp_path / "one"
    shutil.copytree(runs["one"], run)
    assert cli.main(["run", "--resume", str(run), "budget.iterations=2", "--no-progress"]) == 0
    assert _diff(_untimed(run), _untimed(runs["two"])) == []
    assert _same_weights(_weights(run), _weights(runs["two"]))
    assert _generations(run) == _generations(runs["two"])
    # the end-of-run checkpoint reuses the last phase's shards (nothing changed): one folder per position
    assert sorted(p.name for p in (run / checkpoint.CKPT_DIR / "iter_2").iterdir()) == ["learner-1", "state.ckpt"]


def test_fork_from_an_iteration_links_the_shards(runs, tmp_path):
    assert cli.main(["run", "--resume", str(runs["two"]), "--iter", "1", "--out", str(tmp_path), "--no-progress"]) == 0
    fork = _only_run(tmp_path)
    assert _same_weights(_weights(fork, "iter_1"), _weights(runs["one"]))
    assert _untimed(fork) == _untimed(runs["two"])  # it went on from iteration 1 to the budget, exactly
    assert _same_weights(_weights(fork), _weights(runs["two"]))


_KILLER = textwrap.dedent(
    """
    import os, signal, sys
    import torch
    import torch.distributed.checkpoint.filesystem as fs
    from rtpo.rundir import checkpoint

    where, attr, n, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(threads)  # the test process's: float sums (and so the metrics) depend on it
    owner = {"checkpoint": checkpoint, "writer": fs.FileSystemWriter}[where]
    real = getattr(owner, attr)
    calls = [0]

    def wrapped(*args, **kwargs):
        calls[0] += 1
        if calls[0] == n:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)

    setattr(owner, attr, wrapped)
    from rtpo.commands.cli import main

    sys.exit(main(sys.argv[5:]))
    """
)

# where the SIGKILL lands: (what is patched, its call that kills, the checkpoint `latest` names then).
# The 2nd checkpoint is iter_1 (after iteration 0), the 3rd iter_1_phase_1.
KILL_POINTS = {
    "shards on disk, no .metadata": ("writer", "finish", 3, "iter_1"),
    "DCP complete, state.ckpt not written": ("checkpoint", "_sharded_entry", 3, "iter_1"),
    "mid-iteration latest (iter_0_phase_1)": ("checkpoint", "_sharded_entry", 2, "iter_0_phase_1"),
}


@pytest.mark.slow  # subprocess runs killed inside a DCP write: 36 s together
@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_sigkill_inside_a_dcp_write_resumes_exactly(point, runs, tmp_path):
    """A SIGKILL at any point of a checkpoint write leaves `latest` loadable, and the resumed run equals
    the unbroken one (metrics, weights, generations), from an iteration's checkpoint and from a
    mid-iteration one alike.  From iter_0_phase_1 the env's counters of iteration 0's first phase were
    lost (env/answer/no_answer 8 where the unbroken run logs 20: evaluate() logs them and the checkpoint
    between two evaluations did not keep them).  Mutant: drop `built.counters.load` in runner._restore
    and the mid-iteration case turns red on env/*."""
    where, attr, n, latest = KILL_POINTS[point]
    out = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", _KILLER, where, attr, str(n), str(torch.get_num_threads()), *_args(out, 2)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    run = _only_run(out)
    assert checkpoint.latest_name(run) == latest
    if latest == "iter_1":
        assert (run / checkpoint.CKPT_DIR / "iter_1_phase_1").is_dir()  # the torn one, not named by latest
        assert _same_weights(_weights(run), _weights(runs["one"]))  # the previous checkpoint loads, intact
    assert cli.main(["run", "--resume", str(run), "--no-progress"]) == 0
    assert _diff(_untimed(run), _untimed(runs["two"])) == [], "the resumed run's metrics differ from the unbroken run's"
    assert _same_weights(_weights(run), _weights(runs["two"]))
    assert _generations(run) == _generations(runs["two"])  # iteration 1's were written before its checkpoints
    assert sorted(p.name for p in (run / checkpoint.CKPT_DIR).iterdir()) == ["iter_1", "iter_2", "latest"]


@contextlib.contextmanager
def _small_tmpfs(where: Path, size: int):
    """A real tmpfs of `size` bytes mounted at `where` (root only); skips the test where mounting is refused."""
    where.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode(errors='replace').strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


@pytest.mark.slow  # two subprocess runs on a real small file system: ~40 s
def test_a_full_disk_inside_a_dcp_write_is_one_line_and_the_run_resumes_exactly(runs, tmp_path):
    """A tmpfs with room for one checkpoint and not two: the run's second checkpoint (iter_1; the first is
    iter_0_phase_1) fills it inside torch.distributed.checkpoint's write.  `rtpo run` exits 1 with one
    line naming the shard folder (before: 73 lines of a CheckpointException whose short-write RuntimeError
    carries no errno), the torn folder is gone, `latest` still loads, and once the file system grows the
    resumed run equals the unbroken one.  Mutant: no_room returning None brings the traceback back."""
    one_ckpt = _bytes(runs["one"] / checkpoint.CKPT_DIR / "iter_1")
    with _small_tmpfs(tmp_path / "fs", one_ckpt * 3 // 2) as fs:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        r = subprocess.run(
            [sys.executable, "-m", "rtpo", *_args(fs, 2)], capture_output=True, text=True, timeout=600, env=env
        )
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 1 and len(lines) == 1, (r.returncode, r.stderr[-3000:])
        run = _only_run(fs)
        assert f"cannot write {run}/ckpt/iter_1/learner-1 (No space left on device)" in lines[0], lines[0]
        assert "ckpt/iter_0_phase_1 is intact" in lines[0], lines[0]
        assert checkpoint.latest_name(run) == "iter_0_phase_1"
        assert not (run / checkpoint.CKPT_DIR / "iter_1").exists(), "the torn checkpoint folder was left behind"
        subprocess.run(["mount", "-o", f"remount,size={one_ckpt * 4}", str(fs)], check=True)
        r2 = subprocess.run(
            [sys.executable, "-m", "rtpo", "run", "--resume", str(run), "--no-progress"],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )
        assert r2.returncode == 0, r2.stderr[-3000:]
        assert _diff(_untimed(run), _untimed(runs["two"])) == [], "the resumed run differs from one that had room"
        assert _same_weights(_weights(run), _weights(runs["two"]))


def test_enospc_inside_a_dcp_write_is_one_line(runs, tmp_path, capsys, monkeypatch):
    """The same without root, injected: every rank's shard write fails with ENOSPC at the run's second
    checkpoint (torch wraps it in a CheckpointException, a BaseException); `rtpo run` exits 1 with one
    line naming the shard folder and the checkpoint that is intact.  Mutant: no_room returning None
    (the CheckpointException escapes main)."""
    import errno

    import torch.distributed.checkpoint.filesystem as dcp_fs

    real, calls = dcp_fs.FileSystemWriter.write_data, [0]

    def full(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(dcp_fs.FileSystemWriter, "write_data", full)
    rc = cli.main(_args(tmp_path / "out", 2))
    err = capsys.readouterr().err
    run = _only_run(tmp_path / "out")
    assert rc == 1 and err.count("\n") == 1, err
    assert f"cannot write {run}/ckpt/iter_1/learner-1 (No space left on device)" in err, err
    assert checkpoint.latest_name(run) == "iter_0_phase_1" and not (run / checkpoint.CKPT_DIR / "iter_1").exists()


def test_a_rewrite_of_the_same_position_that_fails_keeps_the_old_shards(runs, tmp_path):
    from rtpo.scenario.load import load_scenario

    run = tmp_path / "run"
    shutil.copytree(runs["one"], run)
    cfg = load_scenario(run / checkpoint.CONFIG)
    state = checkpoint.resume_state(run, cfg)
    before = _weights(run)

    def torn(folder: Path) -> dict:
        folder.mkdir()
        (folder / "__0_0.distcp").write_bytes(b"partial")
        raise OSError("disk full")

    body = {k: v for k, v in state.items() if k != "version"}
    with pytest.raises(OSError):
        checkpoint.write_checkpoint(run, cfg, {**body, "learner": checkpoint.ShardedLearner(torn)}, "iter_1")
    assert _same_weights(_weights(run), before)  # state.ckpt still names learner-1
    checkpoint.discard_uncommitted(run)
    assert sorted(p.name for p in (run / checkpoint.CKPT_DIR / "iter_1").iterdir()) == ["learner-1", "state.ckpt"]


def test_a_few_generations_per_iteration_as_jsonl(runs):
    import json

    from rtpo.llm.build import load_task
    from rtpo.scenario.load import load_scenario

    run = runs["two"]
    cfg = load_scenario(run / checkpoint.CONFIG)
    assert cfg.logging.generations_per_iteration == 4
    questions = {i: item.question for i, item in enumerate(load_task(cfg.task, "train").items)}
    assert sorted(_generations(run)) == ["iter_0.jsonl", "iter_1.jsonl"]
    for it in (0, 1):
        rows = [json.loads(x) for x in checkpoint.generations_path(run, it).read_text().splitlines()]
        assert len(rows) == 4 and all(r["iteration"] == it for r in rows)
        for r in rows:
            assert r["question"] == questions[r["query_id"] % len(questions)]
            assert r["turns"][-1]["role"] == "assistant" and 1 <= len(r["turns"]) <= 2 * cfg.task.num_turns - 1
            assert r["reward"] in (0.0, 1.0) and set(r) >= {"gold", "answer"}
        # the trunks of iteration `it`: queries it*4 .. it*4+3 (budget.queries_per_iteration = 4)
        assert {r["query_id"] for r in rows} <= set(range(4 * it, 4 * it + 4))


def _one_line(capsys, args, match: str) -> None:
    rc = cli.main(args)
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and match in err, err


def test_a_damaged_or_foreign_sharded_checkpoint_is_refused(runs, tmp_path, capsys):
    from rtpo.scenario.load import load_scenario

    run = tmp_path / "run"
    shutil.copytree(runs["one"], run)
    shard = run / checkpoint.CKPT_DIR / "iter_1" / "learner-1" / "__0_0.distcp"
    metrics = (run / checkpoint.METRICS).read_bytes()
    shard.write_bytes(shard.read_bytes()[:-10])
    _one_line(capsys, ["run", "--resume", str(run), "--no-progress"], "learner-1/__0_0.distcp is ")
    _one_line(capsys, ["export", str(run), str(tmp_path / "hf")], "learner-1/__0_0.distcp is ")
    shard.unlink()
    _one_line(capsys, ["run", "--resume", str(run), "--no-progress"], "learner-1/__0_0.distcp is missing")
    assert (run / checkpoint.METRICS).read_bytes() == metrics  # refused before anything was touched

    # another run's sharded checkpoint (another seed) in this run's folder
    fake = tmp_path / "fake"
    shutil.copytree(runs["one"], fake)
    cfg = load_scenario(fake / checkpoint.CONFIG)
    state = checkpoint.resume_state(runs["one"], cfg)
    shutil.rmtree(fake / checkpoint.CKPT_DIR)
    other = load_scenario(fake / checkpoint.CONFIG, ["seed=1"])
    checkpoint.write_checkpoint(fake, other, {k: v for k, v in state.items() if k != "version"}, "iter_1")
    (fake / checkpoint.CHECKPOINT_ID).write_text(checkpoint.fingerprint(cfg) + "\n")
    _one_line(capsys, ["run", "--resume", str(fake), "--no-progress"], "belongs to another run")


def test_same_size_damage_to_any_shard_file_is_refused_by_resume_eval_and_export(runs, tmp_path, capsys):
    """Sizes alone used to vouch for the shards: 64 flipped bytes inside the tensor data were resumed
    from and exported silently (weights off by 1.8e4).  Every file's xxh3_128 digest is recorded now and checked on
    every read: a flip in the middle, a shard of random bytes and a `.metadata` of random bytes, each of
    the file's own size, are one line naming the file for `rtpo run --resume`, `rtpo eval` and `rtpo
    export`, and nothing is touched.  Mutant: skip the digest comparison in read_checkpoint and the flip
    resumes (exit 0)."""
    rng = np.random.default_rng(27)
    folder = "learner-1"
    for name, damage in (
        ("__0_0.distcp", "flip"),
        ("__0_0.distcp", "garbage"),
        (".metadata", "garbage"),
    ):
        run = tmp_path / f"{name}-{damage}"
        shutil.copytree(runs["one"], run)
        path = run / checkpoint.CKPT_DIR / "iter_1" / folder / name
        data = bytearray(path.read_bytes())
        if damage == "flip":
            mid = len(data) // 2
            data[mid : mid + 64] = bytes(b ^ 0xFF for b in data[mid : mid + 64])
        else:
            data = bytearray(rng.integers(0, 256, len(data), dtype=np.uint8).tobytes())
        path.write_bytes(bytes(data))
        before = {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}
        for args in (
            ["run", "--resume", str(run), "--no-progress"],
            ["eval", str(run), "--samples", "1", "--queries", "1"],
            ["export", str(run), str(tmp_path / f"hf-{name}-{damage}")],
        ):
            rc = cli.main(args)
            err = capsys.readouterr().err
            assert rc == 2 and err.count("\n") == 1, (args[0], name, damage, err)
            assert f"{folder}/{name}: corrupt sharded learner state" in err, (args[0], name, damage, err)
        after = {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}
        assert after == before, "a refused read changed the run folder"
        assert not (tmp_path / f"hf-{name}-{damage}").exists()
    state = checkpoint.read_checkpoint(checkpoint.latest_path(runs["one"]))
    digests = state["learner"][checkpoint.DIGEST]
    assert sorted(digests) == [".metadata", "__0_0.distcp"] and all(len(h) == 32 for h in digests.values())


def test_a_run_in_the_older_pickled_format_still_resumes(runs, tmp_path, monkeypatch):
    """The format before DCP: the learner's full state dict and the sampler's weights pickled in state.ckpt."""
    from rtpo.llm.learner import FSDPLearner
    from rtpo.rundir import runner as run_mod

    save = run_mod._save_checkpoint
    with monkeypatch.context() as m:
        m.delattr(FSDPLearner, "save_sharded")
        m.setattr(
            run_mod,
            "_save_checkpoint",
            lambda d, c, b, p: save(d, c, dataclasses.replace(b, sampler_state_at_boundary=None), p),
        )
        assert cli.main(_args(tmp_path / "old", 1)) == 0
    run = _only_run(tmp_path / "old")
    state = checkpoint.read_checkpoint(checkpoint.latest_path(run))
    assert isinstance(state["learner"]["model"], dict) and isinstance(state["sampler"], dict)
    assert not list((run / checkpoint.CKPT_DIR / "iter_1").glob("learner-*"))
    assert cli.main(["run", "--resume", str(run), "budget.iterations=2", "--no-progress"]) == 0
    assert _diff(_untimed(run), _untimed(runs["two"])) == []
    assert _same_weights(_weights(run), _weights(runs["two"]))
    assert checkpoint.read_checkpoint(checkpoint.latest_path(run))["learner"]["format"] == "torch-dcp"


def _cli(args: list[str]) -> None:
    """`rtpo ...` in a fresh process: a 2-rank learner's worker and process group live as long as their
    driver process, so each multi-rank run gets its own (as `rtpo run` from a shell does)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    proc = subprocess.run([sys.executable, "-m", "rtpo", *args], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.slow
def test_two_gloo_ranks_write_one_shard_each_and_resume_exactly(tmp_path):
    """backend.world_size=2: rank 0 in the run's process, rank 1 spawned; each writes its own shard."""
    extra = ["backend.world_size=2", "backend.threads_per_rank=1"]
    _cli(_args(tmp_path / "two", 2, extra))
    _cli(_args(tmp_path / "one", 1, extra))
    two, one = _only_run(tmp_path / "two"), _only_run(tmp_path / "one")
    shards = one / checkpoint.CKPT_DIR / "iter_1" / "learner-1"
    assert sorted(p.name for p in shards.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    sizes = [(shards / f"__{r}_0.distcp").stat().st_size for r in (0, 1)]
    assert min(sizes) > 0.3 * sum(sizes)  # each rank wrote about half, none gathered the whole
    assert checkpoint.read_checkpoint(shards.parent / "state.ckpt")["learner"]["world_size"] == 2
    _cli(["run", "--resume", str(one), "budget.iterations=2", "--no-progress"])
    assert _diff(_untimed(one), _untimed(two)) == []
    assert _same_weights(_weights(one), _weights(two))
