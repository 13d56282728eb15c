"""The τ²-airline tools, written from the domain's documented semantics (τ²-bench's airline toolkit).

Each tool is a function `fn(tx, **arguments)` over a database `Transaction` (db.py) with an
OpenAI-style JSON schema, registered in the tool registry (rtpo.llm.tools.TOOLS, under its own name)
as a stateful `Tool` whose per-episode state is the episode's AirlineDB.  All 14 share that one state
(`state_key = "airline"`), so a call sees the writes of the calls before it.  `airline_toolset()` is
the ToolSet an AirlineEnv holds; `call_tool(db, name, arguments)` runs one call through it (gold
replay uses the same path): the registry checks the arguments against the schema, the tool runs in a
transaction, and the result is (new database, result text, ok).  A failure — an unknown tool, wrong
argument types, an unknown field, an id that does not exist, an unavailable flight, a balance too
small — is `ok=False` with the error as the result text ("Error: ..."), the database unchanged (the
transaction is dropped), never an exception.

Semantics kept from τ² (so gold solutions replay to the intended database):
- new reservation ids are HATHAT, HATHAU, HATHAV in that order; new certificates certificate_3221322..4;
  the clock reads 2024-05-15T15:00:00 (policy.md's current time);
- booking checks every flight is `available` on its date with enough seats in the cabin, prices
  flights × passengers + 30 per passenger with insurance + 50 per non-free bag, requires the payments
  to add up exactly and gift cards / certificates to cover their amounts, then deducts gift cards,
  consumes certificates and takes the seats;
- cancelling appends a refund (the negated payment) per payment and sets status "cancelled" (seats
  are not released, as in τ²);
- changing flights keeps segments already booked in the same cabin at their old price, prices new
  ones at today's fare, charges (or refunds) the difference to one payment method (not a certificate;
  a gift card must cover a charge) and leaves seat counts alone (as in τ²);
- changing bags charges 50 per added non-free bag; passengers can be renamed, not added or removed.
Observations are the bytes τ² shows (`render_observation`: its models' field order, every optional
field, its number types, `json.dumps`' separators); ids are matched exactly, as τ² does; a NaN or
Infinity anywhere in a call's arguments is an error.  One deliberate difference: a one-stop search takes
the second leg on the calendar day after the first when the first arrives "+1" (τ² builds the date
string by adding 1 to the day number).
"""

from __future__ import annotations

import ast
import collections
import datetime as _dt
import functools
import json
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rtpo.llm.airline.db import AirlineDB, Transaction
from rtpo.llm.tools import TOOLS as TOOL_REGISTRY
from rtpo.llm.tools import Tool, ToolResult, ToolSet

STATE_KEY = "airline"

NOW = "2024-05-15T15:00:00"
NEW_RESERVATION_IDS = ("HATHAT", "HATHAU", "HATHAV")
NEW_CERTIFICATE_IDS = ("certificate_3221322", "certificate_3221323", "certificate_3221324")
CABINS = ("basic_economy", "economy", "business")
AIRPORTS = (
    ("SFO", "San Francisco"),
    ("JFK", "New York"),
    ("LAX", "Los Angeles"),
    ("ORD", "Chicago"),
    ("DFW", "Dallas"),
    ("DEN", "Denver"),
    ("SEA", "Seattle"),
    ("ATL", "Atlanta"),
    ("MIA", "Miami"),
    ("BOS", "Boston"),
    ("PHX", "Phoenix"),
    ("IAH", "Houston"),
    ("LAS", "Las Vegas"),
    ("MCO", "Orlando"),
    ("EWR", "Newark"),
    ("CLT", "Charlotte"),
    ("MSP", "Minneapolis"),
    ("DTW", "Detroit"),
    ("PHL", "Philadelphia"),
    ("LGA", "LaGuardia"),
)


class ToolError(Exception):
    """A tool call the environment refuses; its message is the feedback the agent reads."""


@dataclass(frozen=True)
class AirlineToolSpec:
    name: str
    description: str
    parameters: dict
    fn: Callable[..., Any]
    writes: bool

    @property
    def schema(self) -> dict:
        """The OpenAI-style function schema (what the Qwen3 template lists in the system prompt)."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


# ---------------------------------------------------------------- schemas

_S = {"type": "string"}
_I = {"type": "integer"}
_N = {"type": "number"}


def _obj(props: dict, required: list[str] | None = None) -> dict:
    return {
        "type": "object",
        "properties": props,
        "required": list(props) if required is None else required,
        "additionalProperties": False,
    }


def _desc(schema: dict, text: str) -> dict:
    return {**schema, "description": text}


_FLIGHT = _obj(
    {
        "flight_number": _desc(_S, "Flight number, such as 'HAT001'."),
        "date": _desc(_S, "The date of the flight in the format 'YYYY-MM-DD', such as '2024-05-01'."),
    }
)
_PASSENGER = _obj(
    {
        "first_name": _desc(_S, "The first name of the passenger, such as 'Noah'."),
        "last_name": _desc(_S, "The last name of the passenger, such as 'Brown'."),
        "dob": _desc(_S, "The date of birth of the passenger in the format 'YYYY-MM-DD', such as '1990-01-01'."),
    }
)
_PAYMENT = _obj(
    {
        "payment_id": _desc(_S, "The payment id stored in the user profile, such as 'credit_card_7815826'."),
        "amount": _desc(_N, "The amount to pay with this payment method."),
    }
)
_CABIN = {"type": "string", "enum": list(CABINS), "description": "The cabin class."}
_RES_ID = _desc(_S, "The reservation ID, such as 'ZFA04Y'.")
_USER_ID = _desc(_S, "The user ID, such as 'sara_doe_496'.")
_IATA = "The {} city airport in three letters, such as '{}'."
_DATE = _desc(_S, "The date of the flight in the format 'YYYY-MM-DD', such as '2024-05-01'.")


# ---------------------------------------------------------------- lookups


def _resolve(tx: Transaction, table: str, key: str) -> str | None:
    """The stored key for `key`, matched exactly as τ² does (`"4wq150"` or `" 4WQ150"` is not found)."""
    return key if tx.contains(table, key) else None


def _user_key(tx: Transaction, user_id: str) -> str:
    key = _resolve(tx, "users", user_id)
    if key is None:
        raise ToolError(f"User {user_id} not found")
    return key


def _reservation_key(tx: Transaction, reservation_id: str) -> str:
    key = _resolve(tx, "reservations", reservation_id)
    if key is None:
        raise ToolError(f"Reservation {reservation_id} not found")
    return key


def _flight_key(tx: Transaction, flight_number: str) -> str:
    key = _resolve(tx, "flights", flight_number)
    if key is None:
        raise ToolError(f"Flight {flight_number} not found")
    return key


def _flight_on(tx: Transaction, flight_number: str, date: str) -> tuple[str, dict, dict]:
    key = _flight_key(tx, flight_number)
    flight = tx.get("flights", key)
    day = flight["dates"].get(date)
    if day is None:
        raise ToolError(f"Flight {key} not found on date {date}")
    return key, flight, day


def _bookable(tx: Transaction, flight_number: str, date: str, cabin: str, seats: int) -> tuple[str, dict, dict]:
    key, flight, day = _flight_on(tx, flight_number, date)
    if day.get("status") != "available":
        raise ToolError(f"Flight {key} not available on date {date}")
    if day["available_seats"][cabin] < seats:
        raise ToolError(f"Not enough seats on flight {key}")
    return key, flight, day


# ---------------------------------------------------------------- tools


def get_user_details(tx: Transaction, user_id: str) -> dict:
    return tx.get("users", _user_key(tx, user_id))


def get_reservation_details(tx: Transaction, reservation_id: str) -> dict:
    return tx.get("reservations", _reservation_key(tx, reservation_id))


def list_all_airports(tx: Transaction) -> list[dict]:
    return [{"iata": code, "city": city} for code, city in AIRPORTS]


def _direct(
    tx: Transaction, date: str, origin: str | None, destination: str | None, after: str | None, dated: bool = False
) -> list[dict]:
    """Available flights on `date` (τ²'s direct search: `date` is null in its results unless `dated`,
    as a one-stop search fills it; a date no flight has, malformed or not, finds nothing)."""
    out = []
    for key in tx.keys("flights"):
        f = tx.get("flights", key)
        day = f["dates"].get(date)
        if day is None or day.get("status") != "available":
            continue
        if (origin is not None and f["origin"] != origin) or (
            destination is not None and f["destination"] != destination
        ):
            continue
        if after is not None and f["scheduled_departure_time_est"] < after:
            continue
        out.append(
            {
                "flight_number": f["flight_number"],
                "origin": f["origin"],
                "destination": f["destination"],
                "status": "available",
                "scheduled_departure_time_est": f["scheduled_departure_time_est"],
                "scheduled_arrival_time_est": f["scheduled_arrival_time_est"],
                "date": date if dated else None,
                "available_seats": day["available_seats"],
                "prices": day["prices"],
            }
        )
    return out


def search_direct_flight(tx: Transaction, origin: str, destination: str, date: str) -> list[dict]:
    return _direct(tx, date, origin, destination, None)


def search_onestop_flight(tx: Transaction, origin: str, destination: str, date: str) -> list[list[dict]]:
    out = []
    for first in _direct(tx, date, origin, None, None, dated=True):
        arrival = first["scheduled_arrival_time_est"]
        next_day = arrival.endswith("+1")
        date2 = (_dt.date.fromisoformat(date) + _dt.timedelta(days=1)).isoformat() if next_day else date
        for second in _direct(tx, date2, first["destination"], destination, arrival.removesuffix("+1"), dated=True):
            out.append([first, second])
    return out


def get_flight_status(tx: Transaction, flight_number: str, date: str) -> str:
    return _flight_on(tx, flight_number, date)[2]["status"]


def calculate(tx: Transaction, expression: str) -> str:
    """Arithmetic on numbers with + - * / and parentheses, rounded to 2 decimals (no eval())."""
    if not expression.strip() or any(c not in "0123456789+-*/(). " for c in expression):
        raise ToolError("Invalid characters in expression")
    try:
        value = _arith(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError) as e:
        raise ToolError(f"Invalid expression ({type(e).__name__})") from None
    return str(round(float(value), 2))


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _arith(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_arith(node.left), _arith(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _arith(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    raise ValueError("unsupported expression")


def transfer_to_human_agents(tx: Transaction, summary: str) -> str:
    return "Transfer successful"


def send_certificate(tx: Transaction, user_id: str, amount: float) -> str:
    key = _user_key(tx, user_id)
    user = tx.mutable("users", key)
    for pid in NEW_CERTIFICATE_IDS:
        if pid not in user["payment_methods"]:
            user["payment_methods"][pid] = {"source": "certificate", "id": pid, "amount": amount}
            return f"Certificate {pid} added to user {user_id} with amount {amount}."
    raise ToolError("Too many certificates")


def book_reservation(
    tx: Transaction,
    user_id: str,
    origin: str,
    destination: str,
    flight_type: str,
    cabin: str,
    flights: list[dict],
    passengers: list[dict],
    payment_methods: list[dict],
    total_baggages: int,
    nonfree_baggages: int,
    insurance: str,
) -> dict:
    ukey = _user_key(tx, user_id)
    user = tx.get("users", ukey)
    rid = next((r for r in NEW_RESERVATION_IDS if not tx.contains("reservations", r)), None)
    if rid is None:
        raise ToolError("Too many reservations")
    n = len(passengers)
    legs, seats, total = [], [], 0
    for fi in flights:
        key, flight, day = _bookable(tx, fi["flight_number"], fi["date"], cabin, n)
        price = day["prices"][cabin]
        legs.append(
            {
                "origin": flight["origin"],
                "destination": flight["destination"],
                "flight_number": key,
                "date": fi["date"],
                "price": price,
            }
        )
        seats.append((key, fi["date"]))
        total += price * n
    if insurance == "yes":
        total += 30 * n
    total += 50 * nonfree_baggages
    for p in payment_methods:
        method = user["payment_methods"].get(p["payment_id"])
        if method is None:
            raise ToolError(f"Payment method {p['payment_id']} not found")
        if method["source"] in ("gift_card", "certificate") and method["amount"] < p["amount"]:
            raise ToolError(f"Not enough balance in payment method {p['payment_id']}")
    paid = sum(p["amount"] for p in payment_methods)
    if paid != total:
        raise ToolError(f"Payment amount does not add up, total price is {total}, but paid {paid}")
    user = tx.mutable("users", ukey)
    for p in payment_methods:
        method = user["payment_methods"][p["payment_id"]]
        if method["source"] == "gift_card":
            method["amount"] -= p["amount"]
        elif method["source"] == "certificate":
            del user["payment_methods"][p["payment_id"]]
    for key, date in seats:
        tx.mutable("flights", key)["dates"][date]["available_seats"][cabin] -= n
    reservation = {
        "reservation_id": rid,
        "user_id": ukey,
        "origin": origin,
        "destination": destination,
        "flight_type": flight_type,
        "cabin": cabin,
        "flights": legs,
        "passengers": [dict(p) for p in passengers],
        "payment_history": [dict(p) for p in payment_methods],
        "created_at": NOW,
        "total_baggages": total_baggages,
        "nonfree_baggages": nonfree_baggages,
        "insurance": insurance,
        "status": None,
    }
    tx.put("reservations", rid, reservation)
    user["reservations"].append(rid)
    return reservation


def cancel_reservation(tx: Transaction, reservation_id: str) -> dict:
    res = tx.mutable("reservations", _reservation_key(tx, reservation_id))
    res["payment_history"].extend(
        {"payment_id": p["payment_id"], "amount": -p["amount"]} for p in list(res["payment_history"])
    )
    res["status"] = "cancelled"
    return res


def _charge(tx: Transaction, user_key: str, payment_id: str, amount: float) -> dict | None:
    """Pay `amount` (may be negative: a refund) of a change with one stored payment method."""
    method = tx.get("users", user_key)["payment_methods"].get(payment_id)
    if method is None:
        raise ToolError("Payment method not found")
    if method["source"] == "certificate":
        raise ToolError("Certificate cannot be used to update reservation")
    if method["source"] == "gift_card" and method["amount"] < amount:
        raise ToolError("Gift card balance is not enough")
    if method["source"] == "gift_card":
        tx.mutable("users", user_key)["payment_methods"][payment_id]["amount"] -= amount
    return {"payment_id": payment_id, "amount": amount} if amount != 0 else None


def update_reservation_flights(
    tx: Transaction, reservation_id: str, cabin: str, flights: list[dict], payment_id: str
) -> dict:
    rkey = _reservation_key(tx, reservation_id)
    res = tx.get("reservations", rkey)
    ukey = _user_key(tx, res["user_id"])
    n = len(res["passengers"])
    legs, total = [], 0
    for fi in flights:
        key = _flight_key(tx, fi["flight_number"])
        kept = next(
            (
                leg
                for leg in res["flights"]
                if leg["flight_number"] == key and leg["date"] == fi["date"] and cabin == res["cabin"]
            ),
            None,
        )
        if kept is not None:
            legs.append(dict(kept))
            total += kept["price"] * n
            continue
        key, flight, day = _bookable(tx, key, fi["date"], cabin, n)
        leg = {
            "flight_number": key,
            "date": fi["date"],
            "price": day["prices"][cabin],
            "origin": flight["origin"],
            "destination": flight["destination"],
        }
        legs.append(leg)
        total += leg["price"] * n
    total -= sum(leg["price"] for leg in res["flights"]) * n
    payment = _charge(tx, ukey, payment_id, total)
    res = tx.mutable("reservations", rkey)
    if payment is not None:
        res["payment_history"].append(payment)
    res["flights"] = legs
    res["cabin"] = cabin
    return res


def update_reservation_baggages(
    tx: Transaction, reservation_id: str, total_baggages: int, nonfree_baggages: int, payment_id: str
) -> dict:
    rkey = _reservation_key(tx, reservation_id)
    res = tx.get("reservations", rkey)
    ukey = _user_key(tx, res["user_id"])
    payment = _charge(tx, ukey, payment_id, 50 * max(0, nonfree_baggages - res["nonfree_baggages"]))
    res = tx.mutable("reservations", rkey)
    if payment is not None:
        res["payment_history"].append(payment)
    res["total_baggages"] = total_baggages
    res["nonfree_baggages"] = nonfree_baggages
    return res


def update_reservation_passengers(tx: Transaction, reservation_id: str, passengers: list[dict]) -> dict:
    rkey = _reservation_key(tx, reservation_id)
    if len(passengers) != len(tx.get("reservations", rkey)["passengers"]):
        raise ToolError("Number of passengers does not match")
    res = tx.mutable("reservations", rkey)
    res["passengers"] = [dict(p) for p in passengers]
    return res


# ---------------------------------------------------------------- the tool table


def _tool(fn, description: str, props: dict, writes: bool = False) -> AirlineToolSpec:
    return AirlineToolSpec(fn.__name__, description, _obj(props), fn, writes)


TOOLS: dict[str, AirlineToolSpec] = {
    t.name: t
    for t in (
        _tool(
            book_reservation,
            "Book a reservation.",
            {
                "user_id": _USER_ID,
                "origin": _desc(_S, "The IATA code for the origin city, such as 'SFO'."),
                "destination": _desc(_S, "The IATA code for the destination city, such as 'JFK'."),
                "flight_type": {"type": "string", "enum": ["one_way", "round_trip"], "description": "The trip type."},
                "cabin": _CABIN,
                "flights": {"type": "array", "items": _FLIGHT, "description": "Each flight of the reservation."},
                "passengers": {"type": "array", "items": _PASSENGER, "description": "Each passenger."},
                "payment_methods": {"type": "array", "items": _PAYMENT, "description": "Each payment method used."},
                "total_baggages": _desc(_I, "The total number of baggage items."),
                "nonfree_baggages": _desc(_I, "The number of non-free baggage items."),
                "insurance": {"type": "string", "enum": ["yes", "no"], "description": "Travel insurance."},
            },
            writes=True,
        ),
        _tool(
            calculate,
            "Calculate the result of a mathematical expression with numbers, + - * /, parentheses and spaces.",
            {"expression": _desc(_S, "The expression, such as '2 + 2'.")},
        ),
        _tool(cancel_reservation, "Cancel the whole reservation.", {"reservation_id": _RES_ID}, writes=True),
        _tool(get_reservation_details, "Get the details of a reservation.", {"reservation_id": _RES_ID}),
        _tool(get_user_details, "Get the details of a user, including their reservations.", {"user_id": _USER_ID}),
        _tool(list_all_airports, "Returns a list of all available airports.", {}),
        _tool(
            search_direct_flight,
            "Search for direct flights between two cities on a specific date.",
            {
                "origin": _desc(_S, _IATA.format("origin", "JFK")),
                "destination": _desc(_S, _IATA.format("destination", "LAX")),
                "date": _DATE,
            },
        ),
        _tool(
            search_onestop_flight,
            "Search for one-stop flights between two cities on a specific date.",
            {
                "origin": _desc(_S, _IATA.format("origin", "JFK")),
                "destination": _desc(_S, _IATA.format("destination", "LAX")),
                "date": _DATE,
            },
        ),
        _tool(
            send_certificate,
            "Send a certificate to a user. Be careful!",
            {"user_id": _USER_ID, "amount": _desc(_N, "The amount of the certificate to send.")},
            writes=True,
        ),
        _tool(
            transfer_to_human_agents,
            "Transfer the user to a human agent, with a summary of the user's issue. Only transfer if the user "
            "explicitly asks for a human agent, or if the issue cannot be solved with the policy and the tools.",
            {"summary": _desc(_S, "A summary of the user's issue.")},
        ),
        _tool(
            update_reservation_baggages,
            "Update the baggage information of a reservation.",
            {
                "reservation_id": _RES_ID,
                "total_baggages": _desc(_I, "The updated total number of baggage items."),
                "nonfree_baggages": _desc(_I, "The updated number of non-free baggage items."),
                "payment_id": _desc(_S, "The payment id stored in the user profile, such as 'credit_card_7815826'."),
            },
            writes=True,
        ),
        _tool(
            update_reservation_flights,
            "Update the flight information of a reservation.",
            {
                "reservation_id": _RES_ID,
                "cabin": _CABIN,
                "flights": {
                    "type": "array",
                    "items": _FLIGHT,
                    "description": "Every flight of the ENTIRE new reservation, unchanged segments included.",
                },
                "payment_id": _desc(_S, "The payment id stored in the user profile, such as 'credit_card_7815826'."),
            },
            writes=True,
        ),
        _tool(
            update_reservation_passengers,
            "Update the passenger information of a reservation.",
            {
                "reservation_id": _RES_ID,
                "passengers": {"type": "array", "items": _PASSENGER, "description": "Each passenger."},
            },
            writes=True,
        ),
        _tool(
            get_flight_status,
            "Get the status of a flight.",
            {"flight_number": _desc(_S, "The flight number."), "date": _desc(_S, "The date of the flight.")},
        ),
    )
}

TOOL_SCHEMAS: tuple[dict, ...] = tuple(t.schema for t in TOOLS.values())


# ---------------------------------------------------------------- observations as τ² shows them
# τ² returns pydantic models and shows the agent `json.dumps(model.model_dump())`: the model's field
# order (not the database's), every field (an absent optional one as null), ints and floats as its
# fields declare them, json's default separators.  The shapes below are those models' fields.


def _int(v: Any) -> Any:
    return int(v) if isinstance(v, float) and v.is_integer() else v


def _float(v: Any) -> Any:
    return float(v) if isinstance(v, int) and not isinstance(v, bool) else v


def _pick(d: dict, fields: tuple) -> dict:
    out = {}
    for f in fields:
        name, conv = f if isinstance(f, tuple) else (f, None)
        v = d.get(name)
        out[name] = conv(v) if conv is not None and v is not None else v
    return out


def _seats(d: Any) -> Any:
    return {k: _int(v) for k, v in d.items()} if isinstance(d, dict) else d


def _passenger(p: dict) -> dict:
    return _pick(p, ("first_name", "last_name", "dob"))


def _payment(p: dict) -> dict:
    return _pick(p, ("payment_id", ("amount", _int)))


def _method(m: dict) -> dict:
    if m.get("source") == "credit_card":
        return _pick(m, ("source", "id", "brand", "last_four"))
    return _pick(m, ("source", "id", ("amount", _float)))


def _flight_leg(f: dict) -> dict:
    return _pick(f, ("flight_number", "origin", "destination", "date", ("price", _int)))


def _reservation(r: dict) -> dict:
    return _pick(
        r,
        (
            "reservation_id", "user_id", "origin", "destination", "flight_type", "cabin",
            ("flights", lambda v: [_flight_leg(x) for x in v]),
            ("passengers", lambda v: [_passenger(x) for x in v]),
            ("payment_history", lambda v: [_payment(x) for x in v]),
            "created_at", ("total_baggages", _int), ("nonfree_baggages", _int), "insurance", "status",
        ),
    )  # fmt: skip


def _user(u: dict) -> dict:
    return _pick(
        u,
        (
            "user_id",
            ("name", lambda v: _pick(v, ("first_name", "last_name"))),
            ("address", lambda v: _pick(v, ("address1", "address2", "city", "country", "state", "zip"))),
            "email", "dob",
            ("payment_methods", lambda v: {k: _method(m) for k, m in v.items()}),
            ("saved_passengers", lambda v: [_passenger(x) for x in v]),
            "membership", "reservations",
        ),
    )  # fmt: skip


def _direct_flight(f: dict) -> dict:
    return _pick(
        f,
        (
            "flight_number", "origin", "destination", "status", "scheduled_departure_time_est",
            "scheduled_arrival_time_est", "date", ("available_seats", _seats), ("prices", _seats),
        ),
    )  # fmt: skip


_SHAPES: dict[str, Callable[[Any], Any]] = {
    "get_user_details": _user,
    "get_reservation_details": _reservation,
    "book_reservation": _reservation,
    "cancel_reservation": _reservation,
    "update_reservation_flights": _reservation,
    "update_reservation_baggages": _reservation,
    "update_reservation_passengers": _reservation,
    "search_direct_flight": lambda v: [_direct_flight(f) for f in v],
    "search_onestop_flight": lambda v: [[_direct_flight(f) for f in pair] for pair in v],
    "list_all_airports": lambda v: [_pick(a, ("iata", "city")) for a in v],
}


def render_observation(name: str, value: Any) -> str:
    """The text τ² shows the agent for tool `name`'s result `value` (a string as it is)."""
    if isinstance(value, str):
        return value
    shape = _SHAPES.get(name)
    return json.dumps(shape(value) if shape is not None else value, default=str)


def _non_finite(value: Any, path: str = "") -> str | None:
    """The argument path of the first NaN or ±Infinity in a tool call's arguments (JSON lets a model write
    them; no amount can be one), None when every number is finite."""
    if isinstance(value, float) and not math.isfinite(value):
        return path or "argument"
    if isinstance(value, dict):
        children = [(f"{path}.{k}" if path else str(k), v) for k, v in value.items()]
    elif isinstance(value, list):
        children = [(f"{path}[{i}]", v) for i, v in enumerate(value)]
    else:
        return None
    for where, v in children:
        found = _non_finite(v, where)
        if found:
            return found
    return None


class AirlineTool(Tool):
    """One airline tool in the registry: stateful, its state the episode's AirlineDB (shared by all 14)."""

    stateful = True
    state_key = STATE_KEY

    def __init__(self, spec: AirlineToolSpec) -> None:
        self.spec = spec
        self.name = spec.name
        self.description = spec.description
        self.parameters = spec.parameters

    def execute(self, arguments: dict, state: Any = None) -> ToolResult:
        if not isinstance(state, AirlineDB):
            raise TypeError(f"airline tool {self.name!r} needs the episode's AirlineDB as its state")
        bad = _non_finite(arguments)
        if bad is not None:
            return ToolResult(f"Error: {bad} must be a finite number", ok=False)
        tx = state.transaction()
        try:
            text = render_observation(self.name, self.spec.fn(tx, **arguments))
        except ToolError as e:
            return ToolResult(f"Error: {e}", ok=False)
        except (KeyError, TypeError, ValueError, ArithmeticError) as e:  # a record the data lacks: feedback
            return ToolResult(f"Error: {type(e).__name__}: {e}", ok=False)
        new = tx.commit()
        return ToolResult(text, ok=True, state=new if new is not state else None)


for _spec in TOOLS.values():
    TOOL_REGISTRY.register(_spec.name)(functools.partial(AirlineTool, _spec))


@functools.lru_cache(maxsize=1)
def airline_toolset() -> ToolSet:
    """The 14 tools in the registry's ToolSet (argument validation, metrics), in the prompt's order."""
    return ToolSet([AirlineTool(spec) for spec in TOOLS.values()])


def call_tool(
    db: AirlineDB, name: str, arguments: Any, metrics: collections.Counter | None = None
) -> tuple[AirlineDB, str, bool]:
    """Run one tool call through the registry: (database after it, result text, ok).  Never raises on
    bad calls; `metrics` receives the registry's counters (tool/calls, tool/ok, tool/errors, ...)."""
    res = airline_toolset().call(
        name, arguments, {STATE_KEY: db}, metrics if metrics is not None else collections.Counter()
    )
    return (res.state or {}).get(STATE_KEY, db), res.text, res.ok
