"""`method: sft` as a run: scenarios/llm/tiny-cpu-math-sft.yaml shrunk (HF engine, the 512-token BPE,
4 problems, 4 one-step iterations), its gold file written by `python -m rtpo.commands.gold` with the real
sandbox.  Checked: the usual run folder (metrics with sft/nll, DCP checkpoints, provenance, export);
a run SIGKILLed once checkpoints exist resumes to the unbroken run's metrics and weights bit for bit;
an RL scenario starts from the SFT run folder, or from its exported HF folder, with the SFT weights
(`backend.init`); a bad demonstrations file fails the CLI with exit 2 and one line naming file and line.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")

import torch  # noqa: E402

from rtpo.commands import cli  # noqa: E402
from rtpo.core.metrics import reproducible  # noqa: E402
from rtpo.rundir import checkpoint  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "scenarios" / "llm" / "tiny-cpu-math-sft.yaml"
RL = ROOT / "scenarios" / "llm" / "tiny-cpu-math-warm.yaml"

SMALL = [
    "backend.engine=hf",
    "backend.tiny_tokenizer=bpe512",
    "backend.max_tokens=8",
    "task.n=4",
    "task.eval_queries=2",
    "budget.queries_per_iteration=2",
    "train.lr=0.01",
    "eval.every=2",
    "logging.keep_last=null",
    "logging.plot=false",
]


def _untimed(run_dir: Path) -> list[dict]:
    return [reproducible(m) for m in checkpoint.read_metrics(run_dir)]


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    path = checkpoint.latest_path(run_dir)
    return checkpoint.model_weights(path, checkpoint.read_checkpoint(path))


def _only_run(out: Path) -> Path:
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return run_dir


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict:
    from rtpo.commands import gold

    root = tmp_path_factory.mktemp("sft")
    models = root / "models"
    data = root / "gold.jsonl"
    args = [str(SCENARIO), *SMALL, f"backend.model_cache={models}", "--out", str(data), "--imperfect", "0.25"]
    assert gold.main(args) == 0
    extra = [*SMALL, f"backend.model_cache={models}", f"method.data={data}"]
    assert (
        cli.main(["run", str(SCENARIO), *extra, "budget.iterations=4", "--out", str(root / "full"), "--no-progress"])
        == 0
    )
    return {"root": root, "models": models, "data": data, "extra": extra, "full": _only_run(root / "full")}


def test_sft_writes_the_usual_run_folder(setup):
    run = setup["full"]
    lines = checkpoint.read_metrics(run)
    assert len(lines) == 4, "one phase (one optimiser step) per iteration"
    nll = [m["sft/nll"] for m in lines]
    assert nll[-1] < nll[0], f"the NLL of the demonstrations must fall under lr 0.01: {nll}"
    assert all(m["budget/rollouts"] == 0 for m in lines), "SFT samples nothing for training"
    assert any("eval/pass@1" in m or any(k.startswith("eval/") for k in m) for m in lines), "evaluated in-run"
    assert (run / "provenance.json").is_file() and (run / checkpoint.CONFIG).is_file()
    shards = list((run / checkpoint.CKPT_DIR).glob("iter_4/learner-*/.metadata"))
    assert shards, "the learner's state is a DCP checkpoint"
    out = setup["root"] / "hf"
    assert cli.main(["export", str(run), str(out)]) == 0
    assert (out / "config.json").is_file()


@pytest.mark.slow  # a subprocess run killed, then resumed: ~1 min on 2 cores
def test_sft_resumes_exactly_after_sigkill(setup, tmp_path):
    out = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, "-m", "rtpo", "run", str(SCENARIO), *setup["extra"], "budget.iterations=4"]
    proc = subprocess.Popen(
        [*cmd, "--out", str(out), "--no-progress"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            dirs = list(out.iterdir()) if out.exists() else []
            if dirs and (dirs[0] / "ckpt" / "latest").exists():
                ckpt = checkpoint.read_checkpoint(checkpoint.latest_path(dirs[0]))
                if ckpt["progress"]["metric_lines"] >= 2:
                    break
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            time.sleep(0.02)
        else:
            pytest.fail("the run never checkpointed 2 phases")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    run = _only_run(out)
    assert len(checkpoint.read_metrics(run)) < 4, "killed before the end"
    assert cli.main(["run", "--resume", str(run), "--no-progress"]) == 0
    assert _untimed(run) == _untimed(setup["full"]), "the resumed SFT run's metrics differ from the unbroken run's"
    a, b = _weights(run), _weights(setup["full"])
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "final weights differ"


def _init_weights(cfg) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    from rtpo.llm.build import _model_dir

    folder = _model_dir(cfg)
    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(f).items()}


def test_rl_starts_from_the_sft_run_folder_and_its_export(setup):
    from rtpo.scenario.load import load_scenario

    run = setup["full"]
    sft = _weights(run)
    rl = [*SMALL, f"backend.model_cache={setup['models']}"]
    for init in (run, setup["root"] / "hf-init"):
        if init != run:
            assert cli.main(["export", str(run), str(init)]) == 0
        cfg = load_scenario(RL, [*rl, f"backend.init={init}"])
        got = _init_weights(cfg)
        for k, v in got.items():
            assert torch.equal(v, sft[k]), f"init {init.name}: {k} is not the SFT run's final weight"
    base = load_scenario(RL, rl)
    assert not all(torch.equal(v, sft[k]) for k, v in _init_weights(base).items()), "without init: the random model"


def test_rl_run_from_the_sft_run(setup, tmp_path):
    """One RTPO iteration of the warm scenario from the SFT run folder, end to end."""
    rl = [*SMALL, f"backend.model_cache={setup['models']}", f"backend.init={setup['full']}", "budget.iterations=1"]
    assert cli.main(["run", str(RL), *rl, "--out", str(tmp_path), "--no-progress"]) == 0
    lines = checkpoint.read_metrics(_only_run(tmp_path))
    assert lines and lines[-1]["budget/rollouts"] > 0


def test_bad_demonstrations_file_exits_2_with_one_line(setup, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    good = setup["data"].read_text().splitlines()
    rec = json.loads(good[1])
    rec["messages"][0]["role"] = "robot"
    bad.write_text(good[0] + "\n" + json.dumps(rec) + "\n")
    extra = [*SMALL, f"backend.model_cache={setup['models']}", f"method.data={bad}", "budget.iterations=1"]
    assert cli.main(["run", str(SCENARIO), *extra, "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bad.jsonl:2: messages[0].role" in err[0], err


def test_resume_refuses_an_init_that_changed(setup, tmp_path, capsys):
    """backend.init's content digest is recorded in provenance; a resume with the same init continues, one
    whose init folder changed since the start (re-exported from another SFT iteration) exits 2 with one
    line.  Mutant: not calling provenance.check_inputs on resume turns the last assertion red."""
    import shutil

    from rtpo.llm.init import content_digest
    from rtpo.rundir import provenance

    hf = tmp_path / "init"
    assert cli.main(["export", str(setup["full"]), str(hf), "--iter", "4"]) == 0
    rl = [*SMALL, f"backend.model_cache={setup['models']}", f"backend.init={hf}", "budget.iterations=1"]
    assert cli.main(["run", str(RL), *rl, "--out", str(tmp_path / "rl"), "--no-progress"]) == 0
    run = _only_run(tmp_path / "rl")
    (first,) = provenance.read(run)
    assert first["inputs"] == {"backend.init": content_digest(hf)}, "the init's content digest is recorded"
    resume = ["run", "--resume", str(run), "--no-progress"]
    assert cli.main([*resume, "budget.iterations=2"]) == 0, "the same init: the resume continues"
    shutil.rmtree(hf)
    assert cli.main(["export", str(setup["full"]), str(hf), "--iter", "2"]) == 0  # other weights, same path
    capsys.readouterr()
    assert cli.main([*resume, "budget.iterations=3"]) == 2, "a changed init must be refused"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "backend.init changed since the run started" in err[0], err
    assert len(checkpoint.read_metrics(run)) == 2 * 3, "nothing ran after the refusal (2 iterations of K = 3 phases)"
