"""Every candidate's module names its canonical tensors' typed record (kernels/layouts.py), and the
record holds those very tensors: a writer reads fields, never dict keys."""

from __future__ import annotations

from dataclasses import fields

import pytest
import torch
from torch import nn

from autoao import search_space
from autoao.kernels.layouts import Dense, GgufBlocks, GroupedInt4, PerChannel, layout_of
from autoao.types import LayerSpec

CANDIDATES = [c for c in search_space.all_candidates() if c.family != "bf16"]


@pytest.mark.parametrize("cand", CANDIDATES, ids=lambda c: c.name)
def test_a_module_s_layout_is_its_canonical_tensors_typed(cand):
    torch.manual_seed(0)
    linear = nn.Linear(256, 128, bias=False).to(torch.bfloat16)
    spec = LayerSpec("l", 256, 128, False, torch.bfloat16)
    if cand.supports(spec, torch.device("cpu")) is not None:
        pytest.skip(cand.supports(spec, torch.device("cpu")))
    module = cand.build(linear)
    layout = module.layout()
    assert type(layout) in (Dense, PerChannel, GroupedInt4, GgufBlocks)
    canonical = module.canonical()
    for f in fields(layout):
        assert getattr(layout, f.name) is canonical[f.name]


def test_a_layout_missing_a_tensor_is_an_error():
    with pytest.raises(KeyError):
        layout_of(PerChannel, {"qweight": torch.zeros(2, 2)})
