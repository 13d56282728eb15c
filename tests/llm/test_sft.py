"""Supervised fine-tuning (rtpo.core.methods.sft, rtpo.llm.sft): demonstrations rendered by the RL
environment itself, a loss on the assistant's tokens only, and the learner step it makes.

Checked here, with the real sandbox, the tiny 512-token-BPE Qwen3 and the real FSDP learner:
- the rows' responses are the assistant's ids alone: the sandbox's output is in the contexts and in no
  response, and the learner's SFT gradient equals transformers' cross-entropy gradient with every
  non-assistant label masked (-100) on the full conversation (an independent implementation of the
  masking).  Mutant (`_train_on_tool_output`, applied in a test that expects both checks to fail):
  each response is the assistant's ids plus the tool message that answered it;
- SFT -> RL: the first context of the RL environment of the same scenario is the SFT sample's first
  context and a token-for-token prefix of each later one;
- bad files: one line naming the file, the line and the field; a file whose recorded tool output is
  not what the sandbox prints now is refused.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("transformers", reason="the llm extra (transformers) is not installed")

import torch  # noqa: E402

from rtpo.core.methods.sft import sft_batch  # noqa: E402
from rtpo.llm.chat import load_qwen3_tokenizer  # noqa: E402
from rtpo.llm.env import LLMEnv  # noqa: E402
from rtpo.llm.gold import math_demonstrations, write_demonstrations  # noqa: E402
from rtpo.llm.sandbox import SandboxLimits  # noqa: E402
from rtpo.llm.sft import DemonstrationError, DemonstrationReplay, attach, load_demonstrations  # noqa: E402
from rtpo.llm.tasks.math import arithmetic_task  # noqa: E402

LIMITS = SandboxLimits(wall_time_s=30.0, cpu_time_s=10)


def _env(model_dir, context_map="identity", n=3):
    task = arithmetic_task(n, 0, max_operand=999, num_operands=3, ops=("+", "*"))
    return LLMEnv(
        task,
        load_qwen3_tokenizer(str(model_dir)),
        context_map=context_map,
        num_turns=3,
        enable_thinking=False,
        sandbox=LIMITS,
        max_calls_per_turn=1,
    )


@pytest.fixture(scope="module")
def gold(tiny_model_dir, tmp_path_factory):
    """Three problems, every demonstration gold (a call, the sandbox's output, the boxed answer)."""
    env = _env(tiny_model_dir)
    path = tmp_path_factory.mktemp("gold") / "math.jsonl"
    write_demonstrations(math_demonstrations(env, imperfect=0.0), path)
    return path


def _violations(env, demos, records) -> list[str]:
    """Every way the rows break 'responses are the assistant's text alone' (empty: none)."""
    out = []
    if len(demos.tokens) != 2 * len(records):
        out.append(f"{len(demos.tokens)} rows for {len(records)} two-turn demonstrations")
    for r, rec in enumerate(records):
        for k in range(2):
            row = 2 * r + k
            text = env.chat.decode(demos.tokens[row])
            if text != rec["messages"][2 * k]["content"] + "<|im_end|>":
                out.append(f"row {row}: the response is {text!r}, not the assistant's text")
            if "<tool_response>" in text or (k == 0 and rec["messages"][1]["content"] in text):
                out.append(f"row {row}: the sandbox's output is in a trained response")
        if rec["messages"][1]["content"] not in env.chat.decode(demos.contexts[2 * r + 1]):
            out.append(f"demonstration {r}: the tool output is missing from the next turn's context")
    return out


def _gaps(model_dir, demos) -> tuple[float, float]:
    """(relative NLL gap, worst relative gradient gap) between the learner's SFT step on the last
    demonstration's rows and transformers' cross-entropy with labels -100 off the assistant's tokens."""
    from transformers import AutoModelForCausalLM

    from rtpo.core.loss import LossConfig
    from rtpo.llm.learner import FSDPLearner, LearnerConfig

    last = demos.seq_id == demos.seq_id[-1]
    rows = np.flatnonzero(last)
    # identity ψ: c_k ⊕ r_k is a prefix of c_{k+1}, so the last row holds the whole conversation
    full = np.concatenate([demos.contexts[rows[-1]], demos.tokens[rows[-1]]])
    labels = np.full(full.size, -100)
    for i in rows:
        start = demos.contexts[i].size
        assert np.array_equal(full[:start], demos.contexts[i]), "identity contexts must be prefixes"
        labels[start : start + demos.tokens[i].size] = full[start : start + demos.tokens[i].size]
    ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    out = ref(input_ids=torch.as_tensor(full)[None], labels=torch.as_tensor(labels)[None])
    out.loss.backward()

    from rtpo.core.methods.sft import Demonstrations

    sub = Demonstrations(demos.contexts.take(rows), demos.tokens.take(rows), demos.seq_id[rows], demos.turn[rows])
    learner = FSDPLearner(model_dir, LearnerConfig(lr=1e-3, temperature=1.0, grad_clip=None))
    logp = learner.logprobs(sft_batch(sub))
    nll = -float(np.mean(logp.values))
    learner.train_step(sft_batch(sub, logp), LossConfig(aggregation="token-mean"))
    grads = dict(learner.model.named_parameters())
    worst = 0.0
    for name, p in ref.named_parameters():
        g, want = grads[name].grad, p.grad
        worst = max(worst, float((g - want).abs().max() / (want.abs().max() + 1e-12)))
    loss = float(out.loss.detach())
    return abs(nll - loss) / loss, worst


def _train_on_tool_output(monkeypatch):
    """The mutant: each response is the assistant's ids followed by the tool message that answered it."""
    real = DemonstrationReplay.replay

    def replay(self, d):
        contexts, responses = real(self, d)
        fb = [c for r, c in d.messages if r != "assistant"]
        return contexts, [
            np.concatenate([r, self.env.chat.tool_block([fb[k]])]) if k < len(fb) else r
            for k, r in enumerate(responses)
        ]

    monkeypatch.setattr(DemonstrationReplay, "replay", replay)


def test_rows_hold_the_assistant_tokens_and_never_the_tool_output(tiny_model_dir, gold):
    env = _env(tiny_model_dir)
    attach(env, gold)
    records = [json.loads(line) for line in gold.read_text().splitlines()]
    assert _violations(env, env.demonstrations(np.arange(3)), records) == []


def test_sft_gradient_is_masked_cross_entropy_on_the_assistant_tokens(tiny_model_dir, gold):
    """The learner's SFT step = transformers' loss with labels -100 off the assistant's tokens."""
    env = _env(tiny_model_dir)
    attach(env, gold)
    nll_gap, grad_gap = _gaps(tiny_model_dir, env.demonstrations(np.array([1])))
    assert nll_gap < 1e-5, f"SFT's NLL is not the masked cross-entropy (relative gap {nll_gap:.2e})"
    assert grad_gap < 1e-4, f"the SFT gradient differs from the masked cross-entropy's ({grad_gap:.2e})"


def test_mutant_training_on_tool_output_is_caught(tiny_model_dir, gold, monkeypatch):
    """The two tests above turn red when the tool message is trained on."""
    _train_on_tool_output(monkeypatch)
    env = _env(tiny_model_dir)
    attach(env, gold)
    records = [json.loads(line) for line in gold.read_text().splitlines()]
    assert _violations(env, env.demonstrations(np.arange(3)), records), "the row check missed the mutant"
    demos = env.demonstrations(np.array([1]))
    # the mutant's rows are not prefixes of one another any more: compare on its last row's conversation
    nll_gap, grad_gap = _gaps(tiny_model_dir, demos)
    assert nll_gap > 1e-3 or grad_gap > 1e-3, "the gradient check missed the mutant"


def test_first_rl_context_is_the_sft_prefix(tiny_model_dir, gold):
    """The RL environment (same template, tools, ψ) starts exactly where the SFT sample c_0 ⊕ r_0 starts,
    and when its policy writes the SFT responses, every later context is the SFT row's, token for token."""
    from rtpo.core.types import Generation, Ragged

    sft_env = _env(tiny_model_dir, context_map="think_strip")
    attach(sft_env, gold)
    rl_env = _env(tiny_model_dir, context_map="think_strip")
    for q in range(3):
        demos = sft_env.demonstrations(np.array([q]))
        (ep,) = rl_env.reset(np.array([q]), np.random.default_rng(0))
        first = rl_env.contexts([ep])[0]
        sample = np.concatenate([demos.contexts[0], demos.tokens[0]])
        assert np.array_equal(sample[: first.size], first), f"problem {q}: RL c_0 is not the SFT sample's prefix"
        assert first.size == demos.contexts[0].size, f"problem {q}: the SFT sample's context is longer than c_0"
        for k in range(1, len(demos.tokens)):
            r = demos.tokens[k - 1]
            gen = Generation(Ragged.from_rows([r]), Ragged.from_rows([np.zeros(r.size)]))
            (ep,), _ = rl_env.step([ep], gen, np.random.default_rng(0))
            assert np.array_equal(rl_env.contexts([ep])[0], demos.contexts[k]), f"problem {q}: c_{k} differs"


def test_stale_tool_output_is_refused(tiny_model_dir, gold, tmp_path):
    lines = gold.read_text().splitlines()
    rec = json.loads(lines[2])
    rec["messages"][1]["content"] = "12345"
    bad = tmp_path / "stale.jsonl"
    bad.write_text("\n".join([lines[0], lines[1], json.dumps(rec)]) + "\n")
    env = _env(tiny_model_dir)
    attach(env, bad)
    with pytest.raises(DemonstrationError, match=r"stale\.jsonl:3: messages\[1\]\.content differs"):
        env.demonstrations(np.array([2]))


GOOD = {"problem": 0, "messages": [{"role": "assistant", "content": "\\boxed{1}"}]}


@pytest.mark.parametrize(
    ("line", "where"),
    [
        ("{not json", r"bad\.jsonl:2: not valid JSON"),
        ("[1, 2]", r"bad\.jsonl:2: a demonstration must be a JSON object"),
        (json.dumps({**GOOD, "problem": -1}), r"bad\.jsonl:2: field 'problem'"),
        (json.dumps({**GOOD, "problem": "0"}), r"bad\.jsonl:2: field 'problem'"),
        (json.dumps({**GOOD, "quality": "great"}), r"bad\.jsonl:2: field 'quality'"),
        (json.dumps({**GOOD, "turns": []}), r"bad\.jsonl:2: unknown field 'turns'"),
        (json.dumps({**GOOD, "messages": []}), r"bad\.jsonl:2: field 'messages'"),
        (json.dumps({**GOOD, "messages": [{"role": "tool", "content": "x"}]}), r"bad\.jsonl:2: messages\[0\]\.role"),
        (
            json.dumps({**GOOD, "messages": [{"role": "assistant", "content": 3}]}),
            r"bad\.jsonl:2: messages\[0\]\.content",
        ),
        (
            json.dumps({**GOOD, "messages": [GOOD["messages"][0], GOOD["messages"][0]]}),
            r"bad\.jsonl:2: messages\[1\]\.role",
        ),
        (json.dumps({**GOOD, "messages": [{"role": "assistant", "content": " "}]}), r"messages\[0\]\.content"),
    ],
)
def test_bad_lines_are_one_line_errors_naming_file_line_and_field(tmp_path, line, where):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + line + "\n")
    with pytest.raises(DemonstrationError, match=where) as err:
        load_demonstrations(path)
    assert "\n" not in str(err.value), "the error must be one line"


def test_file_level_errors(tmp_path, tiny_model_dir):
    with pytest.raises(DemonstrationError, match="no such demonstrations file"):
        load_demonstrations(tmp_path / "missing.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DemonstrationError, match="holds no demonstrations"):
        load_demonstrations(tmp_path / "empty.jsonl")
    env = _env(tiny_model_dir)
    (tmp_path / "far.jsonl").write_text(json.dumps({**GOOD, "problem": 7}) + "\n")
    with pytest.raises(DemonstrationError, match=r"far\.jsonl:1: field 'problem' is 7, but the task has 3"):
        DemonstrationReplay(env, tmp_path / "far.jsonl")
    (tmp_path / "other.jsonl").write_text(json.dumps({**GOOD, "question": "Compute 1 + 1."}) + "\n")
    with pytest.raises(DemonstrationError, match=r"other\.jsonl:1: field 'question' differs"):
        DemonstrationReplay(env, tmp_path / "other.jsonl")


def test_sft_config_needs_a_file_and_no_kl():
    from rtpo.core.methods.sft import SFTConfig

    with pytest.raises(ValueError, match="data must name the demonstrations file"):
        SFTConfig()
    with pytest.raises(ValueError, match="kl_coef must be 0"):
        SFTConfig(data="x.jsonl", kl_coef=0.1)
    assert SFTConfig(data="x.jsonl").epochs == 1
