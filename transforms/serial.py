"""JSON for the transforms' dataclasses (Analysis, Plan, placement moves),
driven by their type hints, so a field added later travels without touching
this module.

Encoding: a dataclass is an object of its init fields, an Enum its value,
tuples/lists/sets lists (sets sorted, so equal values give equal text), dicts
objects (keys str, int or an Enum with such values). Decoding reads the
declared type of each field: `tuple[int, ...]` comes back a tuple,
`frozenset[str]` a frozenset, `Bucket | None` a Bucket or None, so
`decode(T, encode(x)) == x` for every dataclass built from these types.
A hint this module cannot follow (Any, a bare `object`) keeps the JSON value
as it is.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import json
import types
import typing
from typing import Any

_UNIONS = (typing.Union, types.UnionType)


def encode(obj: Any) -> Any:
    """`obj` as plain JSON values (dict, list, str, int, float, bool, None)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: encode(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
    if isinstance(obj, enum.Enum):
        return encode(obj.value)
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, (set, frozenset)):
        return sorted((encode(x) for x in obj), key=_sort_key)
    if isinstance(obj, (list, tuple)):
        return [encode(x) for x in obj]
    if isinstance(obj, dict):
        return {_encode_key(k): encode(v) for k, v in obj.items()}
    raise TypeError(f"cannot encode {type(obj).__name__} as JSON: {obj!r}")


def decode(tp: Any, data: Any) -> Any:
    """The value of declared type `tp` that `encode` turned into `data`."""
    if tp is Any or tp is object or isinstance(tp, typing.TypeVar):
        return data
    if tp is type(None):
        if data is not None:
            raise TypeError(f"expected null, got {data!r}")
        return None
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in _UNIONS:
        if data is None and type(None) in args:
            return None
        problems = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return decode(arg, data)
            except (TypeError, ValueError, KeyError) as e:
                problems.append(str(e))
        raise TypeError(f"{data!r} matches no member of {tp}: {'; '.join(problems)}")
    if origin is typing.Literal:
        if data not in args:
            raise ValueError(f"{data!r} is not one of {args}")
        return data
    if origin is not None:
        return _decode_container(origin, args, data)
    if isinstance(tp, type):
        if dataclasses.is_dataclass(tp):
            return _decode_dataclass(tp, data)
        if issubclass(tp, enum.Enum):
            return tp(data)
        if tp is bool:
            return _expect(data, bool)
        if tp is int:
            if isinstance(data, bool):
                raise TypeError(f"expected int, got {data!r}")
            return _expect(data, int)
        if tp is float:
            if isinstance(data, bool) or not isinstance(data, (int, float)):
                raise TypeError(f"expected float, got {data!r}")
            return float(data)
        if tp is str:
            return _expect(data, str)
        if tp in (list, tuple, set, frozenset, dict):
            return _decode_container(tp, (), data)
    return data


def dumps(obj: Any, indent: int | None = None) -> str:
    """JSON text of `obj` (keys sorted: equal values give equal text)."""
    separators = None if indent is not None else (",", ":")
    return json.dumps(encode(obj), indent=indent, sort_keys=True, separators=separators)


def loads(tp: Any, text: str | bytes) -> Any:
    return decode(tp, json.loads(text))


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    # Resolves `from __future__ import annotations` strings in the class's module.
    return typing.get_type_hints(cls)


def _decode_dataclass(cls: type, data: Any) -> Any:
    if not isinstance(data, dict):
        raise TypeError(f"expected an object for {cls.__name__}, got {data!r}")
    hints = _hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if not f.init or f.name not in data:
            continue   # a field missing from older JSON takes its default
        kwargs[f.name] = decode(hints.get(f.name, Any), data[f.name])
    unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise ValueError(f"{cls.__name__} has no field(s) {sorted(unknown)}")
    return cls(**kwargs)


def _decode_container(origin: Any, args: tuple, data: Any) -> Any:
    if origin is dict or origin is typing.Mapping or _is_abc(origin, "Mapping"):
        if not isinstance(data, dict):
            raise TypeError(f"expected an object, got {data!r}")
        key_tp, value_tp = args if len(args) == 2 else (Any, Any)
        return {_decode_key(key_tp, k): decode(value_tp, v) for k, v in data.items()}
    if not isinstance(data, list):
        raise TypeError(f"expected a list, got {data!r}")
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(decode(args[0], x) for x in data)
        if args and args != ((),):
            if len(args) != len(data):
                raise ValueError(f"expected {len(args)} items, got {data!r}")
            return tuple(decode(a, x) for a, x in zip(args, data))
        return tuple(data)
    item_tp = args[0] if args else Any
    items = [decode(item_tp, x) for x in data]
    if origin in (set, frozenset):
        return origin(items)
    if _is_abc(origin, "Set"):
        return frozenset(items)
    return items   # list, Sequence, Iterable


def _is_abc(origin: Any, name: str) -> bool:
    import collections.abc
    abc = getattr(collections.abc, name)
    return isinstance(origin, type) and issubclass(origin, abc)


def _encode_key(key: Any) -> str:
    if isinstance(key, enum.Enum):
        key = key.value
    if isinstance(key, bool) or not isinstance(key, (str, int)):
        raise TypeError(f"cannot encode dict key {key!r}: keys must be str, int or such an Enum")
    return str(key)


def _decode_key(tp: Any, key: str) -> Any:
    if tp is int:
        return int(key)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        for member in tp:
            if str(member.value) == key:
                return member
        raise ValueError(f"{key!r} is not a {tp.__name__}")
    return key


def _expect(data: Any, tp: type) -> Any:
    if not isinstance(data, tp):
        raise TypeError(f"expected {tp.__name__}, got {data!r}")
    return data


def _sort_key(x: Any) -> str:
    return json.dumps(x, sort_keys=True)
