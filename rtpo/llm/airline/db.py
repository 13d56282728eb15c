"""One airline database per episode: a change log over the shared, read-only base.

The base (db.json, ~7 MB as JSON) is loaded once and never written.  An episode's database is an
immutable `AirlineDB`: the base plus `changes`, a mapping (table, key) -> the record as this episode
last wrote it.  A tool call runs in a `Transaction`: reading falls through to the changes, then the
base; the first write to a record deep-copies that one record (copy on write, a few hundred bytes to
a few kB); `commit()` returns a new AirlineDB whose change map is the old one plus the transaction's
writes.  Records in a committed change map are never mutated again (a later write copies them), so

- a snapshot at a turn boundary is the AirlineDB reference itself (no copy at all);
- restoring a snapshot, or forking G-1 siblings from it, shares it: every sibling's first write
  copies only the records it touches, and no sibling sees another's writes;
- nothing is replayed to fork (the state is the value, not a log of calls);
- a failed tool call discards its transaction: calls are atomic.

Two databases over the same base compare equal iff every record either of them changed is equal
in both (`same_as`), which is exactly equality of the full databases, at the cost of the changes.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

TABLES = ("flights", "users", "reservations")
_EMPTY: Mapping = MappingProxyType({})


class AirlineDB:
    """An immutable database value: `base` (shared, never written) + `changes` (this episode's records)."""

    __slots__ = ("base", "changes", "source")

    def __init__(
        self,
        base: Mapping[str, Mapping[str, Any]],
        changes: Mapping[tuple[str, str], Any] = _EMPTY,
        source: str | None = None,
    ) -> None:
        self.base = base
        self.changes = changes if isinstance(changes, MappingProxyType) else MappingProxyType(dict(changes))
        self.source = source  # the data folder the base was loaded from (pickles by reference), or None

    def get(self, table: str, key: str) -> Any | None:
        """The record (read it, never mutate it: it may be shared), None when absent."""
        rec = self.changes.get((table, key))
        if rec is not None:
            return rec
        return self.base[table].get(key)

    def contains(self, table: str, key: str) -> bool:
        return (table, key) in self.changes or key in self.base[table]

    def keys(self, table: str) -> Iterator[str]:
        """Keys of a table: the base's, then records this episode created."""
        base = self.base[table]
        yield from base
        for t, k in self.changes:
            if t == table and k not in base:
                yield k

    def transaction(self) -> Transaction:
        return Transaction(self)

    def same_as(self, other: AirlineDB) -> bool:
        """Equality of the full databases (both over one base), comparing only the changed records."""
        if self.base is not other.base:
            raise ValueError("AirlineDB.same_as: the two databases have different bases")
        keys = set(self.changes) | set(other.changes)
        return all(self.get(t, k) == other.get(t, k) for t, k in keys)

    def diff(self, other: AirlineDB) -> list[tuple[str, str]]:
        """(table, key) of every record that differs between the two databases."""
        keys = set(self.changes) | set(other.changes)
        return sorted((t, k) for t, k in keys if self.get(t, k) != other.get(t, k))

    def materialize(self) -> dict:
        """The full database as one fresh dict (tests and debugging; the cost a deep copy would have)."""
        out = {t: dict(self.base[t]) for t in TABLES}
        for (t, k), rec in self.changes.items():
            out[t][k] = rec
        return copy.deepcopy(out)

    def change_bytes(self) -> int:
        """Size of this episode's own state (the pickled change map): what a snapshot would have to carry."""
        return len(pickle.dumps(dict(self.changes), protocol=pickle.HIGHEST_PROTOCOL))

    def __reduce__(self):
        # a pickled episode (a Ray chunk) carries only its changes when the base came from a data folder:
        # the receiving process re-attaches its own (cached) copy of that folder's base
        if self.source is not None:
            return (_rebuild, (self.source, dict(self.changes)))
        return (AirlineDB, (self.base, dict(self.changes)))


class Transaction:
    """The working copy of one tool call: reads fall through, the first write to a record copies it."""

    __slots__ = ("db", "writes")

    def __init__(self, db: AirlineDB) -> None:
        self.db = db
        self.writes: dict[tuple[str, str], Any] = {}

    def get(self, table: str, key: str) -> Any | None:
        rec = self.writes.get((table, key))
        return rec if rec is not None else self.db.get(table, key)

    def contains(self, table: str, key: str) -> bool:
        return (table, key) in self.writes or self.db.contains(table, key)

    def keys(self, table: str) -> Iterator[str]:
        seen = set()
        for k in self.db.keys(table):
            seen.add(k)
            yield k
        for t, k in self.writes:
            if t == table and k not in seen:
                yield k

    def mutable(self, table: str, key: str) -> Any:
        """The record, private to this transaction (copied on first access), for writing."""
        rec = self.writes.get((table, key))
        if rec is None:
            src = self.db.get(table, key)
            if src is None:
                raise KeyError(f"{table}/{key}")
            rec = self.writes[(table, key)] = copy.deepcopy(src)
        return rec

    def put(self, table: str, key: str, record: Any) -> None:
        """A new (or wholly replaced) record; the transaction owns `record` from here on."""
        self.writes[(table, key)] = record

    def commit(self) -> AirlineDB:
        if not self.writes:
            return self.db
        merged = dict(self.db.changes)
        merged.update(self.writes)
        return AirlineDB(self.db.base, MappingProxyType(merged), self.db.source)


def _rebuild(source: str, changes: dict) -> AirlineDB:
    from rtpo.llm.airline.data import load_airline

    return AirlineDB(load_airline(source).db, changes, source)
