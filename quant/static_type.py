"""StaticType: a GGML type id that numba sees as part of a kernel's signature, not as a value.

A kernel that branches on a type id at run time carries the code of every type: numba types and
LLVM optimizes all of them when it first compiles the kernel, whatever the model holds (the
packed matmul and the repacking pass were most of a first run's compile time).  Passed a
StaticType instead, a kernel gets one specialization per type actually used, and each
specialization holds only its own type's code: numba compiles what a model needs and caches each
type's variant on its own.

`StaticType(id)` is a frozen value; numba types it as `StaticTypeType(id)` (its data is empty).
Inside njit code `key.id` is the type id as a constant.  To run a function that branches on the
id with only one type's branch, overload a stub on the key: its implementation closes over
`key.id` and calls the function with that constant, which numba's dead-branch pruning follows
into an inlined callee (repack.unpack_static is one).  Instances are made once per weight, never
in a decode step.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from numba.core import types
from numba.extending import NativeValue, models, overload_attribute, register_model, typeof_impl, unbox

from .types import QTYPES


@dataclass(frozen=True)
class StaticType:
    id: int  # a GGML type id (quant/types.py), or a kernel's own id for a variant of one


class StaticTypeType(types.Type):
    def __init__(self, id: int):
        self.id = id
        super().__init__(name=f"StaticType({id})")


@typeof_impl.register(StaticType)
def _typeof(val, c):
    return StaticTypeType(val.id)


register_model(StaticTypeType)(models.OpaqueModel)


@unbox(StaticTypeType)
def _unbox(typ, obj, c):
    return NativeValue(c.context.get_dummy_value())


@overload_attribute(StaticTypeType, "id")
def _id(key):
    value = key.id
    return lambda key: value


def static_type(type_id: int) -> StaticType:
    """The StaticType of a GGML type id, made once per id (so a kernel call allocates nothing)."""
    return _INTERNED.get(type_id) or StaticType(type_id)


_INTERNED = MappingProxyType({t: StaticType(t) for t in QTYPES})
