"""A second device on a CPU-only machine, for tests: tensors that live "elsewhere" and refuse to meet
host tensors, the way a CUDA tensor refuses to meet a CPU one.

Inside `guarded_device()`, a tensor moved or created on GUARDED (torch's `meta` device name) becomes a
`Guarded` tensor: it reports `device='meta'`, holds real CPU values, and every op on it computes on
those values, so results are the CPU's bit for bit.  An op that mixes a Guarded tensor with a host
tensor of one or more dimensions raises `CrossDevice` (as CUDA raises "Expected all tensors to be on
the same device"); what CUDA allows stays allowed: 0-dim host tensors (scalars), copies between devices
(`copy_`, `.to`), and host index tensors in indexing.  `.cpu()` / `.to("cpu")` brings a plain host
tensor back; `.numpy()` on a Guarded tensor fails, as on CUDA.

Not modelled: generators (a sampler on this device keeps the CPU generator) and collectives (gloo
runs on the host values).
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

GUARDED = torch.device("meta")
aten = torch.ops.aten

# ops that legitimately take host and device tensors together (as on CUDA)
_CROSS_OK = {
    aten.copy_.default,
    aten._to_copy.default,
    aten.lift_fresh.default,
    aten._has_compatible_shallow_copy_type.default,
}
_INDEX_OPS = {aten.index.Tensor, aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default}


class CrossDevice(RuntimeError):
    """An op mixed a tensor on the guarded device with a host tensor."""


class Guarded(torch.Tensor):
    """A tensor on the guarded device: reports `meta`, computes on `elem` (a CPU tensor)."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor):
        out = torch.Tensor._make_wrapper_subclass(
            cls,
            elem.size(),
            strides=elem.stride(),
            storage_offset=elem.storage_offset(),
            dtype=elem.dtype,
            layout=elem.layout,
            device=GUARDED,
            requires_grad=elem.requires_grad,
        )
        out.elem = elem
        return out

    def __repr__(self) -> str:  # no data access through the wrapper
        return f"Guarded({self.elem!r})"

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _dispatch(func, args, kwargs or {})


def _is_guarded_device(dev) -> bool:
    return dev is not None and torch.device(dev).type == GUARDED.type


def _empty_meta(x) -> bool:
    return (
        isinstance(x, torch.Tensor) and not isinstance(x, Guarded) and x.device.type == GUARDED.type and x.numel() == 0
    )


def _unwrap(x):
    if _empty_meta(x):
        return torch.empty(x.shape, dtype=x.dtype)
    return x.elem if isinstance(x, Guarded) else x


def _wrap(x):
    return Guarded(x) if isinstance(x, torch.Tensor) and not isinstance(x, Guarded) else x


def _check(func, args, kwargs) -> bool:
    """Whether any tensor argument is Guarded; raises CrossDevice when one meets a host tensor."""
    if func in _INDEX_OPS:  # host index tensors are fine (CUDA accepts them); check self and values only
        flat = [args[0]] + ([args[2]] if len(args) > 2 else [])
    else:
        flat, _ = tree_flatten((args, kwargs))
    tensors = [t for t in flat if isinstance(t, torch.Tensor)]
    guarded = [t for t in tensors if isinstance(t, Guarded)]
    # torch.tensor(..., device=) builds below the dispatcher: a real meta tensor.  An empty one (a
    # cache's placeholder, as transformers' DynamicCache makes) holds no data and counts as guarded.
    guarded += [t for t in tensors if _empty_meta(t)]
    if any(t.device.type == GUARDED.type and not isinstance(t, Guarded) and not _empty_meta(t) for t in tensors):
        raise CrossDevice(
            f"{func}: a real meta tensor (no data) met the guarded device; create it on the host and .to() it"
        )
    if guarded and func not in _CROSS_OK:
        host = [t for t in tensors if not isinstance(t, Guarded) and not _empty_meta(t) and t.dim() > 0]
        if host:
            raise CrossDevice(
                f"Expected all tensors to be on the same device (device guard): {func} got a tensor on "
                f"{GUARDED} and a host tensor of shape {tuple(host[0].shape)}"
            )
    return bool(guarded)


def _dispatch(func, args, kwargs):
    any_guarded = _check(func, args, kwargs)
    device = kwargs.get("device")
    if func is aten._to_copy.default:
        src = args[0]
        to_guard = _is_guarded_device(device) or (device is None and isinstance(src, Guarded))
        kw = dict(kwargs, device=torch.device("cpu"))
        out = func(_unwrap(src), **kw)
        return Guarded(out) if to_guard else out
    if func is aten.copy_.default:  # dst.copy_(src) across devices
        dst, src = args[0], args[1]
        _unwrap(dst).copy_(_unwrap(src))
        return dst
    if _is_guarded_device(device):  # factories: torch.full(..., device=GUARDED) and friends
        kwargs = dict(kwargs, device=torch.device("cpu"))
        return tree_map(_wrap, func(*tree_map(_unwrap, args), **kwargs))
    out = func(*tree_map(_unwrap, args), **tree_map(_unwrap, kwargs))
    if not any_guarded:
        return out
    if func._schema.name.endswith("_") and args and isinstance(args[0], Guarded):
        return args[0]  # in place: the same (guarded) tensor
    if isinstance(kwargs.get("out"), Guarded):
        return kwargs["out"]
    return tree_map(_wrap, out)  # views wrap a view of the host values: writes through them land


class _Mode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _dispatch(func, args, kwargs or {})


@contextlib.contextmanager
def guarded_device():
    """Within: GUARDED is a second device (see the module docstring).  Module .to() keeps parameter
    identity (swap), so tied weights stay tied."""
    old = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        with _Mode():
            yield GUARDED
    finally:
        torch.__future__.set_swap_module_params_on_conversion(old)
