"""The candidate registry: family name -> Candidate class, with "did you mean" lookups."""

from __future__ import annotations

import dataclasses
import difflib
import re
from typing import Any

from torch import nn

from autoao.kernels import QuantizedLinear
from autoao.search_space._base import Candidate

_FAMILIES: dict[str, type[Candidate]] = {}


def register(cls: type[Candidate]) -> type[Candidate]:
    """Class decorator: make a Candidate family available by its `family` name."""
    if cls.family in _FAMILIES:
        raise ValueError(f"candidate family {cls.family!r} is registered twice "
                         f"({_FAMILIES[cls.family].__qualname__} and {cls.__qualname__})")
    _FAMILIES[cls.family] = cls
    return cls


def families() -> list[str]:
    """Registered family names, in registration order."""
    return list(_FAMILIES)


def _unknown(name: str) -> ValueError:
    available = families()
    msg = f"Unknown candidate {name!r}."
    suggestions = difflib.get_close_matches(name, available, n=3, cutoff=0.5)
    if suggestions:
        msg += f" Did you mean: {', '.join(suggestions)}?"
    return ValueError(msg + f"\nAvailable: {', '.join(available)}")


def get(name: str, **params: Any) -> Candidate:
    """The candidate `name` with `params`, e.g. get("int4_wo", group_size=64).

    `name` may also carry its parameters, as `Candidate.name` writes them: "int4_wo(group_size=64)".
    Raises ValueError for an unknown family (with suggestions) or bad parameters.
    """
    family, parsed = _split(name)
    if family not in _FAMILIES:
        raise _unknown(family)
    cls = _FAMILIES[family]
    try:
        return cls(**{**parsed, **params})
    except TypeError as e:
        fields = [f.name for f in dataclasses.fields(cls)]
        raise ValueError(f"candidate {family!r}: bad parameters {params or parsed} ({e}); "
                         f"its parameters are: {', '.join(fields) or 'none'}") from None


def from_dict(d: Any) -> Candidate:
    """Inverse of Candidate.to_dict(): {"family": ..., "params": {...}}."""
    if not isinstance(d, dict) or not isinstance(d.get("family"), str) or not isinstance(d.get("params", {}), dict):
        raise ValueError(f"a candidate spec must look like {{'family': str, 'params': {{...}}}}, got {d!r}")
    return get(d["family"], **d.get("params", {}))


_NAME_RE = re.compile(r"^\s*([A-Za-z0-9_]+)\s*(?:\((.*)\))?\s*$")


def _split(name: str) -> tuple[str, dict[str, Any]]:
    m = _NAME_RE.match(name)
    if not m:
        raise ValueError(f"cannot parse candidate {name!r}; write it as family or family(key=value, ...), "
                         "e.g. int4_wo(group_size=64)")
    family, args = m.group(1), m.group(2)
    params: dict[str, Any] = {}
    for item in filter(None, (a.strip() for a in (args or "").split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"cannot parse {item!r} in candidate {name!r}: expected key=value")
        value = value.strip().strip("'\"")
        params[key.strip()] = int(value) if value.lstrip("-").isdigit() else value
    return family, params


def all_candidates() -> list[Candidate]:
    """Every registered family with every variant of its parameters: the default search space."""
    out: list[Candidate] = []
    for cls in _FAMILIES.values():
        for params in getattr(cls, "variants", ({},)):
            out.append(cls(**params))
    return out


def candidate_of(module: nn.Module) -> Candidate | None:
    """The candidate a module was built from (None for a plain nn.Linear or a foreign module)."""
    if not isinstance(module, QuantizedLinear):
        return None
    for cls in _FAMILIES.values():
        if cls.module_cls is module.format_class():
            params = module.params()
            names = {f.name for f in dataclasses.fields(cls)}
            return cls(**{k: v for k, v in params.items() if k in names})
    return None
