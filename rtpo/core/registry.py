"""Name -> object registries (estimators, methods, tasks): duplicates raise, unknown names list the valid ones."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
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
