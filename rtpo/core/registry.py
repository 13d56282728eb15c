"""Name -> object registries (estimators, methods, tasks): duplicates raise, unknown names list the valid ones."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar
from weakref import WeakSet

T = TypeVar("T")

_ALL: WeakSet[Registry] = WeakSet()  # every registry of the process (rollback of a failed plugin)
# open journals (recording), each with the ids of the frames on the stack when it opened: every
# register() appends (registry, name, the module whose body runs it below those frames)
_JOURNALS: list[tuple[list[tuple[Registry, str, str | None]], frozenset[int]]] = []


class Registry(Generic[T]):
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        _ALL.add(self)

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            for journal, outside in _JOURNALS:
                journal.append((self, name, _registering_module(outside)))
            return obj

        return deco

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            valid = ", ".join(sorted(self._items)) or "(none)"
            raise KeyError(f"unknown {self.kind} {name!r}; valid: {valid}") from None

    def build(self, name: str, **params):
        """Call the registered factory `name` with `params`; a bad parameter is a one-line ValueError
        naming the entry (`tool 'search': ... unexpected keyword argument ...`)."""
        factory = self.get(name)
        try:
            return factory(**params)
        except TypeError as e:
            raise ValueError(f"{self.kind} {name!r}: {e}") from None

    def override(self, name: str, obj: T) -> _Override[T]:
        """A context manager: within the block, `get(name)` returns `obj` instead of the registered entry;
        the entry is back afterwards, also when the block raises.  The name must be registered already
        (an unknown name is the KeyError of get, listing the valid ones): an override replaces, it never
        adds.  Consumers that look entries up by name at call time (every method, the claim tests) see
        the override; a module that bound the function itself at import time does not.

        Only `__exit__` restores: an entered override whose handle is dropped stays in place (a mutant
        activated for a whole pytest session relies on that; a generator-based context manager would
        restore the entry whenever the garbage collector closed it)."""
        return _Override(self, name, obj)

    @contextmanager
    def temporary(self) -> Iterator[Registry[T]]:
        """Whatever is registered, overridden or replaced within the block is undone afterwards: the
        registry holds exactly its entries from before (a test that registers an example entry)."""
        saved = dict(self._items)
        try:
            yield self
        finally:
            self._items.clear()
            self._items.update(saved)

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


class _Override(Generic[T]):
    """Registry.override's context manager (see there)."""

    def __init__(self, registry: Registry[T], name: str, obj: T) -> None:
        self._registry, self._name, self._obj = registry, name, obj
        self._old = registry.get(name)  # unknown names fail here, before anything changes

    def __enter__(self) -> T:
        self._registry._items[self._name] = self._obj
        return self._obj

    def __exit__(self, *exc: object) -> None:
        self._registry._items[self._name] = self._old


def _registering_module(outside: frozenset[int]) -> str | None:
    """The module whose top-level code is running the register() call: the innermost module body on the
    stack below the frames `outside` (a plugin's, also when it goes through a helper such as
    register_function); None when there is none (an entry point's callable, called after its import)."""
    frame = sys._getframe(2)
    while frame is not None and id(frame) not in outside:
        if frame.f_code.co_name == "<module>":
            return frame.f_globals.get("__name__")
        frame = frame.f_back
    return None


def snapshot() -> dict[Registry, dict]:
    """The entries of every registry that exists now (for rollback_failed_import)."""
    return {r: dict(r._items) for r in list(_ALL)}


@contextmanager
def recording() -> Iterator[list[tuple[Registry, str, str | None]]]:
    """Within the block, every register() call of every registry (those created in the block too) is
    appended to the yielded journal as (registry, name, the module whose body made it)."""
    journal: list[tuple[Registry, str, str | None]] = []
    outside, frame = set(), sys._getframe(0)
    while frame is not None:
        outside.add(id(frame))
        frame = frame.f_back
    entry = (journal, frozenset(outside))
    _JOURNALS.append(entry)
    try:
        yield journal
    finally:
        _JOURNALS.remove(entry)


def rollback_failed_import(
    before: dict[Registry, dict],
    journal: list[tuple[Registry, str, str | None]],
    keep: Callable[[str | None], bool],
) -> list[str]:
    """After an import that failed: remove every entry registered since `before` (snapshot) unless
    keep(module) says the module that registered it stays (a library such as rtpo.llm imported on the way
    registers its built-ins), and put back any entry it replaced.  `journal` (recording) names the
    registering module of each register() call, in every registry, those created during the import too;
    an entry written straight into a registry's dict without register() is judged by the module of the
    class or function it is (an instance counts as the failed import's).  Returns "kind name" of each
    entry removed."""
    removed = []
    journaled = set()
    for reg, name, by in reversed(journal):
        journaled.add((reg, name))
        if keep(by) or name not in reg._items:
            continue
        old = before.get(reg, {})
        if name in old:
            reg._items[name] = old[name]
        else:
            del reg._items[name]
        removed.append(f"{reg.kind} {name}")
    for reg, items in before.items():
        for name in list(reg._items):
            obj = reg._items[name]
            if (reg, name) in journaled or (name in items and items[name] is obj):
                continue
            owner = getattr(obj, "__module__", None) if isinstance(obj, type) or inspect.isroutine(obj) else None
            if owner is not None and keep(owner):
                continue
            if name in items:
                reg._items[name] = items[name]
            else:
                del reg._items[name]
            removed.append(f"{reg.kind} {name}")
    return removed
