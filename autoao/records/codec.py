"""Run files as JSON: records to plain data and back, written atomically, read with a check of
their version. A leaf module of autoao.records.

    write(path, record)                  any record (dataclasses, decisions with their kind) as JSON
    from_dict(RunContext, data, path)    typed records back, RunFileError naming the file and field
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from autoao.common import atomic_write
from autoao.decisions import Decision, decision_fields, decision_type
from autoao.upgrades import RUN_FILES_VERSION


class RunFileError(ValueError):
    """A run file that cannot be read: missing, corrupt, or written by a newer autoao."""


def to_dict(record: Any) -> Any:
    """A record as plain JSON data: dataclasses as objects (decisions with their kind), tuples as lists."""
    if isinstance(record, Decision):
        return {k: to_dict(v) for k, v in decision_fields(record).items()}
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        return {f.name: to_dict(getattr(record, f.name)) for f in dataclasses.fields(record)}
    if isinstance(record, (list, tuple)):
        return [to_dict(v) for v in record]
    if isinstance(record, dict):
        return {k: to_dict(v) for k, v in record.items()}
    return record


def write(path: Path, record: Any) -> None:
    """Write `record` as JSON, atomically."""
    text = json.dumps(to_dict(record), indent=1, default=str, allow_nan=True)
    atomic_write(path, lambda f: f.write(text.encode()))


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise RunFileError(f"cannot read {path}: {e}") from None
    if not isinstance(data, dict):
        raise RunFileError(f"{path} is not an autoao run file (a JSON object was expected)")
    version = data.get("version", 0)
    if not isinstance(version, int) or version > RUN_FILES_VERSION:
        raise RunFileError(f"{path} was written by a newer autoao (run-files version {version}; this autoao reads "
                           f"up to {RUN_FILES_VERSION}): upgrade autoao, or re-run the search with this one")
    return data


T = TypeVar("T")


def from_dict(cls: type[T], data: Any, path: Path | str = "run file") -> T:
    """Build `cls` (a dataclass) from JSON data, nested records and int dict keys included;
    RunFileError naming the file and the field when something is missing or of the wrong kind."""
    try:
        return _build(cls, data, cls.__name__)
    except (KeyError, TypeError, ValueError) as e:
        raise RunFileError(f"{path} does not match this autoao's {cls.__name__}: {e}; re-run the search "
                           "to write it anew") from None


def _build(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(tp):
            return None
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        errors = []
        for option in options:
            try:
                return _build(option, value, where)
            except (KeyError, TypeError, ValueError) as e:
                errors.append(str(e))
        raise TypeError(f"{where}: {errors[0]}")
    if tp is Decision:
        if not isinstance(value, dict) or not isinstance(value.get("kind"), str):
            raise TypeError(f"{where} should be a decision object with a kind")
        return _build(decision_type(value["kind"]), {k: v for k, v in value.items() if k != "kind"}, where)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise TypeError(f"{where} should be an object, got {type(value).__name__}")
        hints = typing.get_type_hints(tp)
        kwargs = {}
        for f in dataclasses.fields(tp):
            if f.name in value:
                kwargs[f.name] = _build(hints[f.name], value[f.name], f"{where}.{f.name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise KeyError(f"{where}.{f.name} is missing")
        return tp(**kwargs)
    if origin is tuple:
        item = typing.get_args(tp)[0]
        if not isinstance(value, list):
            raise TypeError(f"{where} should be a list, got {type(value).__name__}")
        return tuple(_build(item, v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is list:
        (item,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise TypeError(f"{where} should be a list, got {type(value).__name__}")
        return [_build(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        key_t, val_t = typing.get_args(tp)
        if not isinstance(value, dict):
            raise TypeError(f"{where} should be an object, got {type(value).__name__}")
        return {_build(key_t, k if key_t is not int else int(k), where): _build(val_t, v, f"{where}[{k!r}]")
                for k, v in value.items()}
    return _scalar(tp, value, where)


def _scalar(tp: Any, value: Any, where: str) -> Any:
    """A JSON scalar as `tp` (float, int, str, bool, None or Any); TypeError naming `where` otherwise."""
    if tp is Any:
        return value
    if tp is float:
        if isinstance(value, str) and value in ("inf", "-inf", "nan", "Infinity", "-Infinity", "NaN"):
            return float(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise TypeError(f"{where} should be a number, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise TypeError(f"{where} should be an integer, got {value!r}")
    if tp in (str, bool):
        if not isinstance(value, tp):
            raise TypeError(f"{where} should be {tp.__name__}, got {value!r}")
        return value
    if tp is type(None):
        if value is not None:
            raise TypeError(f"{where} should be null, got {value!r}")
        return None
    raise TypeError(f"{where}: unsupported field type {tp!r}")
