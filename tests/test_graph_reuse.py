"""The unchanged model's capture (Baselines.replays) is every compiled verification's baseline side:
on a GPU, its graphs still compute the model's output after the run has compiled, captured and
freed other work, and a measurement with it compiles only the plan's side."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)).cuda().to(torch.bfloat16)


class _Into(nn.Module):
    """The model, its output copied into a static tensor: a replay's result is readable."""

    def __init__(self, model: nn.Module, out: torch.Tensor) -> None:
        super().__init__()
        self.model, self.out = model, out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out.copy_(self.model(x))


@GPU
def test_a_capture_replays_the_unchanged_model_after_other_work_is_compiled_and_freed():
    from autoao.stages.measure import captured

    model, x = _model(), torch.randn(8, 256, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(8, 256, device="cuda", dtype=torch.bfloat16)
    replays = captured(torch.compile(_Into(model, out)), [x])
    with torch.no_grad():
        want = model(x).clone()
    # what a run does next: dynamo reset, other modules compiled and captured, memory freed and
    # overwritten with NaN (a graph reading freed memory would read them)
    torch._dynamo.reset()
    other = nn.Linear(256, 4096).cuda().to(torch.bfloat16)
    captured(torch.compile(other), [torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)])
    del other
    torch.cuda.empty_cache()
    junk = torch.full((64, 1024, 1024), float("nan"), device="cuda")
    out.zero_()
    for replay in replays:
        replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)
    del junk


@GPU
def test_a_measurement_with_the_capture_compiles_only_the_plan(monkeypatch):
    from autoao.stages import bench as B

    model, x = _model(), torch.randn(8, 256, device="cuda", dtype=torch.bfloat16)
    base = B.captured(torch.compile(model), [x])
    compiled = []
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda m, **kw: compiled.append(m) or real(m, **kw))
    plan = nn.Linear(1024, 256).cuda().to(torch.bfloat16)
    installed = []
    bench = SimpleNamespace(model=model, examples=[x], base_replays=tuple(base),
                            install=lambda modules: installed.append(dict(modules)))
    got_base, got_plan = B.graph_rounds(bench, {"2": plan}, rounds=3)
    assert len(compiled) == 1 and installed[0] == {"2": plan}  # the plan's side only
    assert len(got_base) == len(got_plan) == B.GRAPH_ROUNDS and all(t[0] > 0 for t in got_base + got_plan)
    compiled.clear()
    bench.base_replays = ()
    B.graph_rounds(bench, {"2": plan}, rounds=3)
    assert len(compiled) == 2  # without it, both sides
