"""The search space: candidate families, their parameters, and where each applies.

    >>> from autoao import search_space
    >>> search_space.get("int4_wo", group_size=64).name
    'int4_wo(group_size=64)'
    >>> [c.name for c in search_space.all_candidates()][:3]
    ['bf16', 'int8_dyn', 'int8_wo']
"""

from __future__ import annotations

if __name__ != "autoao.search_space":  # the bare name from the checkout's root: the installed package's
    from autoao.common import step_aside

    step_aside(__name__, __file__)

from autoao.search_space._base import Candidate, LayerSpec
from autoao.search_space._registry import all_candidates, candidate_of, families, from_dict, get, register

# Importing the family modules registers them (order = table order in reports).
from autoao.search_space import dense as _dense  # noqa: E402,F401  isort: skip
from autoao.search_space import int8 as _int8  # noqa: E402,F401  isort: skip
from autoao.search_space import int4 as _int4  # noqa: E402,F401  isort: skip
from autoao.search_space import fp8 as _fp8  # noqa: E402,F401  isort: skip
from autoao.search_space import sparse24 as _sparse24  # noqa: E402,F401  isort: skip
from autoao.search_space import int4_sym as _int4_sym  # noqa: E402,F401  isort: skip  (compressed-tensors targets)
from autoao.search_space import gguf as _gguf  # noqa: E402,F401  isort: skip  (llama.cpp target only)

__all__ = ["Candidate", "LayerSpec", "all_candidates", "candidate_of", "families", "from_dict", "get", "register"]
