"""LoRA adapters on the FSDP learner (backend.lora; rtpo.llm.lora over peft).

Each claim test names the mutant that turns it red in its docstring.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing as mp
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from test_learner import CFG, _ref_engine, assert_weights_close, make_batch

from rtpo.core.loss import LossConfig
from rtpo.core.metrics import wall_clock
from rtpo.llm.learner import FSDPLearner, LearnerConfig, launch_learner
from rtpo.llm.lora import LoRASpec, is_adapter_key, merge_weights
from rtpo.scenario.load import ConfigError, load_scenario

pytest.importorskip("peft")

TINY_CPU = str(Path(__file__).resolve().parents[2] / "scenarios/llm/tiny-cpu.yaml")
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SPEC = LoRASpec(rank=4, alpha=8.0, target_modules=ALL_LINEAR)
LORA_CFG = dataclasses.replace(CFG, lora=SPEC, kl_reference=True)
LOSS = LossConfig(kl_coef=0.1)


def _base_params(learner: FSDPLearner) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in learner.model.named_parameters() if not is_adapter_key(n)}


def _adapters(learner: FSDPLearner) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in learner.model.named_parameters() if is_adapter_key(n)}


def test_full_rank_zero_b_reproduces_frozen_model(tiny_model_dir):
    """Rank = the layers' full width (128), adapters on every linear layer, B = 0 at the start: the
    adapted learner's log-probs equal the frozen model's bit for bit, and its merged weights are the base.

    Mutant: init_lora_weights=False in rtpo.llm.lora.attach (B random, not zero) turns it red."""
    batch = make_batch(tiny_model_dir, 0)
    plain = FSDPLearner(tiny_model_dir, CFG)
    full = FSDPLearner(tiny_model_dir, dataclasses.replace(CFG, lora=LoRASpec(rank=128, target_modules=ALL_LINEAR)))
    assert any(p.shape[0] == 128 for n, p in full.model.named_parameters() if "lora_A" in n), "rank is not full"
    np.testing.assert_array_equal(
        full.logprobs(batch).values, plain.logprobs(batch).values, err_msg="zero-B adapters changed log-probs"
    )
    assert_weights_close(full.weights(), plain.weights(), atol=0)


def test_step_trains_adapters_only(tiny_model_dir):
    """An RTPO step (clipped loss + KL to the base) moves the adapters and leaves every base weight
    bit-identical; the optimiser holds the adapters alone.

    Mutant: `model.requires_grad_(True)` after get_peft_model in rtpo.llm.lora.attach turns it red."""
    learner = FSDPLearner(tiny_model_dir, LORA_CFG)
    base0, ad0 = _base_params(learner), _adapters(learner)
    opt_params = {id(p) for g in learner.opt.param_groups for p in g["params"]}
    assert opt_params == {id(p) for n, p in learner.model.named_parameters() if is_adapter_key(n)}
    for seed in (1, 2):
        metrics = learner.train_step(make_batch(tiny_model_dir, seed), LOSS)
        assert metrics["train/grad_norm"] > 0
    for n, p in _base_params(learner).items():
        assert torch.equal(p, base0[n]), f"base weight {n} changed under LoRA"
    moved = [n for n, p in _adapters(learner).items() if not torch.equal(p, ad0[n])]
    assert any("lora_B" in n for n in moved), "no adapter B matrix moved"


def test_kl_reference_is_base_with_adapters_off(tiny_model_dir):
    """With LoRA the KL reference is the same model with its adapters disabled (no second copy of the
    weights): after training it gives the base model's log-probs, while the policy's have moved.

    Mutant: `with contextlib.nullcontext():` instead of `self.peft.disable_adapter()` in
    FSDPLearner._reference_logp turns it red (the reference would be the adapted policy)."""
    learner = FSDPLearner(tiny_model_dir, LORA_CFG)
    assert learner.ref_model is None, "LoRA learner loaded a second copy of the weights for the KL reference"
    for seed in (1, 2, 3):
        learner.train_step(make_batch(tiny_model_dir, seed), LOSS)
    batch = make_batch(tiny_model_dir, 0)
    rows = np.arange(len(batch.contexts))
    ref = learner._reference_logp(batch, rows).double().numpy()
    base = _ref_engine(tiny_model_dir).teacher_forced_logprobs(batch.contexts, batch.tokens, CFG.temperature)
    np.testing.assert_allclose(ref, base.values, atol=1e-5, rtol=0, err_msg="reference is not the base model")
    policy = learner.logprobs(batch).values
    assert np.abs(policy - base.values).max() > 1e-4, "the adapters did not move the policy (test is vacuous)"


def test_merge_equals_peft_merge_and_unload(tiny_model_dir):
    """merge_weights (W₀ + (α/r)·B·A from a state dict) equals peft's own merge_and_unload, with α ≠ r.

    Mutant: scaling 1.0 instead of (α/r) in rtpo.llm.lora.merge_weights turns it red."""
    from rtpo.llm.lora import attach
    from rtpo.llm.model import load_hf_model

    model = load_hf_model(tiny_model_dir)
    peft_model = attach(model, SPEC)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    ours = merge_weights({k: v.clone() for k, v in model.state_dict().items()}, SPEC.scaling)
    theirs = peft_model.merge_and_unload().state_dict()
    assert_weights_close(ours, dict(theirs), atol=1e-6)


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def test_adapters_only_checkpoint_is_small_and_resumes_exactly(tiny_model_dir, tmp_path):
    """The DCP checkpoint of a LoRA learner holds the adapters and their AdamW moments alone (a small
    fraction of a full learner's checkpoint), and a learner resumed from it continues bit for bit.

    Mutants: FSDPLearner._trained returning the whole state dict turns the size check red; dropping the
    optimiser state from the dcp.load in _do_load_sharded turns the resume check red."""
    batches = [make_batch(tiny_model_dir, 20 + i) for i in range(3)]
    a = FSDPLearner(tiny_model_dir, LORA_CFG)
    for b in batches[:2]:
        a.train_step(b, LOSS)
    info = a.save_sharded(tmp_path / "lora")
    full = FSDPLearner(tiny_model_dir, CFG)
    full.train_step(batches[0], LossConfig())
    full.save_sharded(tmp_path / "full")
    n_adapter = sum(p.numel() for p in _adapters(a).values())
    lora_bytes, full_bytes = _dir_bytes(tmp_path / "lora"), _dir_bytes(tmp_path / "full")
    meta = dcp.FileSystemReader(str(tmp_path / "lora")).read_metadata().state_dict_metadata
    model_keys = [k.removeprefix("model.") for k in meta if k.startswith("model.")]
    assert model_keys and all(is_adapter_key(k) for k in model_keys), f"non-adapter weights stored: {model_keys[:3]}"
    stored = sum(math.prod(m.size) for m in meta.values() if hasattr(m, "size"))
    assert stored <= 3 * n_adapter + len(model_keys), f"{stored} numbers stored for {n_adapter} adapter weights"
    assert lora_bytes < 0.25 * full_bytes, f"adapter checkpoint {lora_bytes} B vs full {full_bytes} B"
    resumed = FSDPLearner(tiny_model_dir, LORA_CFG)
    resumed.load_state_dict({"format": "torch-dcp", "path": info["dir"], "steps": info["steps"], "tied": info["tied"]})
    m_a, m_r = a.train_step(batches[2], LOSS), resumed.train_step(batches[2], LOSS)
    for k in m_a:
        if not wall_clock(k) and k not in ("time/train_s",):
            assert m_a[k] == m_r[k], f"{k}: {m_a[k]} resumed vs {m_r[k]} uninterrupted"
    assert_weights_close(resumed.weights(), a.weights(), atol=0)


def test_full_state_dict_round_trip_is_adapters_only(tiny_model_dir):
    """state_dict()/load_state_dict() (the Ray path's full state) carry the adapters alone and restore them.

    Mutant: strict=True in _do_load_state_dict's options turns it red (the base keys are missing)."""
    a = FSDPLearner(tiny_model_dir, LORA_CFG)
    a.train_step(make_batch(tiny_model_dir, 1), LOSS)
    state = a.state_dict()
    assert state["model"] and all(is_adapter_key(k) for k in state["model"]), sorted(state["model"])[:3]
    b = FSDPLearner(tiny_model_dir, LORA_CFG)
    b.load_state_dict(state)
    assert_weights_close(b.weights(), a.weights(), atol=0)


def test_export_merges_adapters_into_hf_folder(tiny_model_dir, tmp_path):
    """`rtpo export`'s llm writer on a LoRA checkpoint: the adapters read back from DCP are merged into
    the base, and transformers' model from the folder gives the adapted learner's log-probs.

    Mutant: rtpo.llm.build.export writing base_weights(model_dir) without merge_weights turns it red."""
    from rtpo.llm.build import export
    from rtpo.llm.engines.base import SamplingConfig
    from rtpo.llm.engines.hf import HFEngine
    from rtpo.rundir.checkpoint import _sharded_model_weights

    learner = FSDPLearner(tiny_model_dir, LORA_CFG)
    for seed in (1, 2, 3):
        learner.train_step(make_batch(tiny_model_dir, seed), LOSS)
    info = learner.save_sharded(tmp_path / "ckpt")
    weights = _sharded_model_weights({"path": info["dir"], "tied": info["tied"]})
    assert all(is_adapter_key(k) for k in weights)
    lora = ["enabled=true", "rank=4", "alpha=8.0", f"target_modules=[{','.join(ALL_LINEAR)}]"]
    cfg = load_scenario(TINY_CPU, [f"backend.model={tiny_model_dir}", *("backend.lora." + o for o in lora)])
    assert cfg.backend.lora.spec() == SPEC
    out = export(cfg, weights, tmp_path / "hf")
    batch = make_batch(tiny_model_dir, 0)
    got = HFEngine(out, SamplingConfig(temperature=CFG.temperature)).teacher_forced_logprobs(
        batch.contexts, batch.tokens, CFG.temperature
    )
    want = learner.logprobs(batch).values
    base = _ref_engine(tiny_model_dir).teacher_forced_logprobs(batch.contexts, batch.tokens, CFG.temperature)
    assert np.abs(want - base.values).max() > 1e-3, "the adapters did not move the policy (test is vacuous)"
    # float32 merge rounding: ~1e-6 relative on log-probs of ~10; the unmerged base is off by > 1e-3
    np.testing.assert_allclose(got.values, want, atol=5e-5, rtol=0, err_msg="exported folder != adapted model")


def test_bad_lora_config_is_one_line_naming_the_key(tiny_model_dir):
    """rank 0 and a target module the model lacks are one-line ConfigErrors naming backend.lora.*; the
    unknown module is refused from the model's config before any engine or learner is built.

    Mutant: removing the check_targets call from rtpo.llm.build._model_dir turns the second check red."""
    from rtpo.llm.build import _model_dir

    with pytest.raises(ConfigError) as e:
        load_scenario(TINY_CPU, ["backend.lora.enabled=true", "backend.lora.rank=0"])
    assert "backend.lora.rank" in str(e.value) and "\n" not in str(e.value), str(e.value)
    cfg = load_scenario(
        TINY_CPU,
        [f"backend.model={tiny_model_dir}", "backend.lora.enabled=true", "backend.lora.target_modules=[q_proj,qkv]"],
    )
    with pytest.raises(ConfigError) as e:
        _model_dir(cfg)
    msg = str(e.value)
    assert "backend.lora.target_modules" in msg and "qkv" in msg and "\n" not in msg, msg


def test_scenario_lora_reaches_learner_config():
    """backend.lora reaches the LearnerConfig both the driver's learner and every Ray trainer rank build
    (rtpo.llm.build.learner_config), the adapters' init seed being the run's seed; disabled, the learner
    trains every weight.

    Mutant: `lora=b.lora.spec()` (seed 0 whatever the run's seed) in learner_config turns it red."""
    from rtpo.llm.build import learner_config

    lora = ["backend.lora.enabled=true", "backend.lora.rank=2", "backend.lora.alpha=4"]
    on = load_scenario(TINY_CPU, [*lora, "seed=7"])
    assert learner_config(on).lora == LoRASpec(2, 4.0, 0.0, ("q_proj", "k_proj", "v_proj", "o_proj"), init_seed=7)
    assert learner_config(load_scenario(TINY_CPU, [])).lora is None


def _attached_adapters(model_dir, spec: LoRASpec, rng_seed: int) -> dict[str, torch.Tensor]:
    """One simulated rank: its global RNG left by whatever ran before (seeded rng_seed, then drawn from),
    then the model loaded and the adapters attached as FSDPLearner does."""
    from rtpo.llm.lora import attach
    from rtpo.llm.model import load_hf_model

    torch.manual_seed(rng_seed)
    torch.rand(rng_seed + 1)
    model = load_hf_model(model_dir)
    attach(model, spec)
    return {n: p.detach().clone() for n, p in model.named_parameters() if is_adapter_key(n)}


def test_ranks_with_different_rng_histories_build_the_same_adapters(tiny_model_dir):
    """Two ranks whose global torch RNG drew differently before the learner was built (another rank,
    another Ray actor, a test process that ran other tests) attach bit-identical initial adapters, leave
    their global RNG as it was, and another init_seed gives other adapters (the seed is what decides).
    FSDP2 shards each rank's own unsharded copy, so differing copies would train a mixture.

    Mutant: removing `torch.default_generator.manual_seed(spec.init_seed)` from rtpo.llm.lora.attach
    turns it red (A would follow each rank's RNG; the 2-rank slow test then fails by ~0.3 in log-probs)."""
    rank0 = _attached_adapters(tiny_model_dir, SPEC, 0)
    rank1 = _attached_adapters(tiny_model_dir, SPEC, 1)
    assert rank0 and rank0.keys() == rank1.keys()
    for n in rank0:
        assert torch.equal(rank0[n], rank1[n]), f"{n}: ranks with other RNG histories drew other adapters"
    from rtpo.llm.lora import attach
    from rtpo.llm.model import load_hf_model

    model = load_hf_model(tiny_model_dir)
    torch.manual_seed(5)
    want = torch.rand(3)
    torch.manual_seed(5)
    attach(model, SPEC)
    assert torch.equal(torch.rand(3), want), "attach moved the caller's global RNG"
    other = _attached_adapters(tiny_model_dir, dataclasses.replace(SPEC, init_seed=1), 0)
    a_keys = [n for n in rank0 if "lora_A" in n]
    assert a_keys and all(not torch.equal(other[n], rank0[n]) for n in a_keys), "init_seed does not decide A"


def _two_rank_driver(model_dir, cfg: LearnerConfig, out_path: str) -> None:
    import torch.distributed as dist

    learner = launch_learner(model_dir, cfg, world_size=2, threads_per_rank=1)
    try:
        torch.save(_steps(learner, model_dir), out_path)
    finally:
        learner.close()
        dist.destroy_process_group()


def _steps(learner: FSDPLearner, model_dir) -> dict:
    ctx, rsp, seq = (20, 4, 9, 33, 12), (6, 3, 8, 5, 7), [0, 1, 1, 2, 3]
    out: dict = {"metrics": []}
    for i in range(2):
        out["metrics"].append(learner.train_step(make_batch(model_dir, 10 + i, ctx, rsp, seq), LOSS))
    out["logp"] = learner.logprobs(make_batch(model_dir, 0, ctx, rsp, seq)).values
    out["weights"] = learner.weights()
    return out


@pytest.mark.slow  # two FSDP2 processes
def test_lora_two_gloo_ranks_equal_one_process(tiny_model_dir, tmp_path):
    """FSDP2 over 2 gloo ranks with adapters (frozen and trainable parameters in one FSDP unit) gives the
    one-process update: log-probs, metrics and merged weights.

    Mutant: dropping the `* self.world_size` gradient factor in _do_train_step turns it red."""
    cfg = dataclasses.replace(LORA_CFG, micro_batch_tokens=24)
    out_path = str(tmp_path / "two.pt")
    proc = mp.get_context("spawn").Process(target=_two_rank_driver, args=(str(tiny_model_dir), cfg, out_path))
    proc.start()
    proc.join(timeout=600)
    assert proc.exitcode == 0, f"two-rank driver exited with {proc.exitcode}"
    two = torch.load(out_path, weights_only=False)
    one = _steps(FSDPLearner(tiny_model_dir, cfg), tiny_model_dir)
    np.testing.assert_allclose(two["logp"], one["logp"], atol=1e-5, rtol=0)
    for m2, m1 in zip(two["metrics"], one["metrics"]):
        for key in m1:
            if not wall_clock(key):
                assert abs(m2[key] - m1[key]) <= 1e-4 * max(1.0, abs(m1[key])), key
    assert_weights_close(two["weights"], one["weights"], atol=5e-6)
