"""rtpo.core.registry: an override replaces an entry for one block and always puts it back; temporary()
undoes whatever a block registered."""

from __future__ import annotations

import pytest

from rtpo.core.registry import Registry


def _reg() -> Registry:
    reg: Registry = Registry("thing")
    reg.register("a")(lambda: "a")
    return reg


def test_override_replaces_then_restores_even_on_error():
    reg = _reg()
    orig = reg.get("a")
    with reg.override("a", lambda: "patched") as new:
        assert reg.get("a") is new and reg.get("a")() == "patched"
    assert reg.get("a") is orig
    with pytest.raises(RuntimeError), reg.override("a", lambda: "patched"):
        raise RuntimeError("boom")
    assert reg.get("a") is orig and reg.names() == ["a"]


def test_override_of_an_unknown_name_lists_the_valid_ones():
    reg = _reg()
    with pytest.raises(KeyError, match="unknown thing 'b'; valid: a"), reg.override("b", object()):
        pass
    assert "b" not in reg


def test_temporary_forgets_what_the_block_registered():
    reg = _reg()
    orig = reg.get("a")
    with reg.temporary():
        reg.register("b")(lambda: "b")
        reg._items["a"] = None  # even a direct replacement is undone
        assert reg.names() == ["a", "b"]
    assert reg.names() == ["a"] and reg.get("a") is orig


def test_an_entered_override_whose_handle_is_dropped_stays():
    """A mutant is entered once for a whole session and its undo handle may be dropped: garbage
    collection must not put the original entry back (it did with a generator context manager, and
    `rtpo verify --mutants` then ran the estimator mutants against the real estimator)."""
    import gc

    reg = _reg()
    with reg.temporary():
        new = object()
        cm = reg.override("a", new)
        cm.__enter__()
        del cm
        gc.collect()
        assert reg.get("a") is new
    assert reg.get("a")() == "a"
