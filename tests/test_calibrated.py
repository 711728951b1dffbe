"""Calibrated quantization (kernels/algorithms.py): each algorithm against a plain-torch reference or
the property that defines it, the modules and candidates built from them, plans that name them, and
a tiny search that chooses among them."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import autoao
from autoao import search_space
from autoao.calibration import LayerStats
from autoao.evaluators.sensitivity import heldout_split, layer_errors
from autoao.kernels import algorithms
from autoao.kernels.quant import dequantize_int4_groupwise, quantize_int4_groupwise, quantize_int8_per_channel
from autoao.profile import profile
from tiny_models import build


def correlated_inputs(rows: int, k: int, seed: int = 0) -> torch.Tensor:
    """[rows, K] activations with correlated channels and a few 10x outlier channels, like an LLM's."""
    g = torch.Generator().manual_seed(seed)
    mix = torch.eye(k) + 0.5 * torch.randn(k, k, generator=g) / k ** 0.5
    x = torch.randn(rows, k, generator=g) @ mix
    x[:, :4] *= 10
    return x


def weight(n: int, k: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) / k ** 0.5


def output_error(w: torch.Tensor, dq: torch.Tensor, x: torch.Tensor) -> float:
    return float((x @ (w - dq).t()).pow(2).sum())


def stats_of(x: torch.Tensor) -> LayerStats:
    return LayerStats(x.square().sum(0).sqrt(), x.abs().amax(0), x, x.abs().mean(0))


##### GPTQ ######################################################################################

def reference_gptq_int4(w: torch.Tensor, h: torch.Tensor, group: int, damp: float) -> torch.Tensor:
    """Textbook GPTQ, one column at a time with no lazy blocks: the dequantized weight [N, K]."""
    w = w.double().clone()
    h = h.double() + damp * h.diagonal().mean() * torch.eye(h.shape[0], dtype=torch.float64)
    hinv = torch.linalg.cholesky(torch.linalg.inv(h), upper=True)
    out = torch.empty_like(w)
    for i in range(w.shape[1]):
        if i % group == 0:
            _, s, z = quantize_int4_groupwise(w[:, i:i + group].float(), group)
            s, z = s.double()[:, 0], z.double()[:, 0]
        q = torch.round((w[:, i] - z) / s + 8).clamp(0, 15)
        out[:, i] = (q - 8) * s + z
        err = (w[:, i] - out[:, i]) / hinv[i, i]
        w[:, i:] -= err[:, None] * hinv[i, i:][None, :]
    return out.float()


def test_gptq_matches_the_textbook_column_loop():
    k, group = 256, 32  # two lazy blocks of 128 columns
    w, x = weight(48, k), correlated_inputs(512, k)
    h = x.t() @ x / len(x)
    q, s, z = algorithms.gptq_int4(w, group, h, damp=0.01)
    ours, ref = dequantize_int4_groupwise(q, s, z), reference_gptq_int4(w, h, group, 0.01)
    # float32 lazy blocks vs float64 columns: a rounding decision may flip, rarely
    assert (ours == ref).float().mean() > 0.99
    assert output_error(w, ours, x) == pytest.approx(output_error(w, ref, x), rel=0.02)


@pytest.mark.parametrize("family", ["int4_wo(group_size=32, algorithm=gptq)", "int8_wo(algorithm=gptq)"])
def test_gptq_output_error_on_its_calibration_rows_is_below_rtn(family):
    k = 128
    w, x = weight(64, k), correlated_inputs(512, k)
    lin = nn.Linear(k, 64, bias=False)
    with torch.no_grad():
        lin.weight.copy_(w)
    gptq = search_space.get(family).build(lin, stats_of(x))
    rtn = search_space.get(family.replace(", algorithm=gptq", "").replace("(algorithm=gptq)", "")).build(lin)
    with torch.no_grad():
        ref = x @ w.t()
        e_gptq, e_rtn = (gptq(x) - ref).pow(2).sum(), (rtn(x) - ref).pow(2).sum()
    assert e_gptq < 0.9 * e_rtn  # correlated inputs: error feedback pays clearly


def test_gptq_falls_back_to_rtn_when_it_does_not_pay():
    # a Hessian whose one excited channel is all there is: damping makes the feedback useless, and
    # the fit must then never be worse than RTN on those rows
    k = 64
    w = weight(16, k)
    x = torch.zeros(8, k)
    x[:, 0] = 1.0
    q, s, z = algorithms.gptq_int4(w, 32, x.t() @ x / 8, damp=1.0)
    rq = quantize_int4_groupwise(w, 32)
    dq, rdq = dequantize_int4_groupwise(q, s, z), dequantize_int4_groupwise(*rq)
    assert output_error(w, dq, x) <= output_error(w, rdq, x) + 1e-9


def test_gptq_damping_grows_with_channels_per_row():
    assert algorithms.gptq_damping(64, 100_000) == algorithms.GPTQ_DAMP
    assert algorithms.gptq_damping(576, 1024) == pytest.approx(576 / 1024)
    assert algorithms.gptq_damping(4096, 256) == 1.0


def test_int8_gptq_keeps_rtn_scales():
    w, x = weight(32, 64), correlated_inputs(256, 64)
    q, scale = algorithms.gptq_int8(w, x.t() @ x / len(x))
    assert torch.equal(scale, quantize_int8_per_channel(w)[1])
    assert q.dtype == torch.int8 and q.abs().max() <= 127


##### AWQ #######################################################################################

def test_awq_picks_the_grid_point_a_brute_force_search_picks():
    k, group = 128, 32
    w, x = weight(64, k), correlated_inputs(256, k)
    mean = x.abs().mean(0)
    errs = []
    for i in range(algorithms.AWQ_GRID):
        s = mean.pow(i / algorithms.AWQ_GRID)
        s = algorithms.round_scale(s / (s.max() * s.min()).sqrt())
        dq = dequantize_int4_groupwise(*quantize_int4_groupwise(w * s, group))
        errs.append(float(((x / s) @ dq.t() - x @ w.t()).pow(2).sum()))
    best = min(range(len(errs)), key=errs.__getitem__)
    s = algorithms.awq_scale(w, group, mean, x)
    expect = mean.pow(best / algorithms.AWQ_GRID)
    assert torch.equal(s, algorithms.round_scale(expect / (expect.max() * expect.min()).sqrt()))
    assert errs[best] <= errs[0]  # alpha = 0 is RTN
    assert best > 0  # the outlier channels make scaling pay here


def test_awq_with_alpha_zero_only_is_rtn():
    w, x = weight(32, 64), correlated_inputs(64, 64)
    assert torch.equal(algorithms.awq_scale(w, 32, x.abs().mean(0), x, grid=1), torch.ones(64))


def test_awq_clip_picks_each_groups_best_ratio_and_never_loses_on_the_sample():
    k, group = 128, 32
    w, x = weight(48, k), correlated_inputs(256, k)
    w[3, 5] = 2.0  # an outlier weight: its group's range is worth shrinking
    clipped = algorithms.awq_clip(w, group, x)
    assert output_error(w, dequantize_int4_groupwise(*quantize_int4_groupwise(clipped, group)), x) \
        <= output_error(w, dequantize_int4_groupwise(*quantize_int4_groupwise(w, group)), x)
    assert not torch.equal(clipped, w)
    # brute force, one (output channel, group) at a time: the ratio with the least error in that
    # group's share of the output
    ratios = [1.0 - i / algorithms.AWQ_CLIP_GRID for i in range(int(algorithms.AWQ_CLIP_SHRINK * algorithms.AWQ_CLIP_GRID))]
    for row, g in ((3, 0), (0, 1), (20, 3)):
        cols = slice(g * group, (g + 1) * group)
        wg = w[row:row + 1, cols]

        def err(r: float) -> float:
            c = wg.clamp(float(wg.min()) * r, float(wg.max()) * r) if r < 1 else wg
            dq = dequantize_int4_groupwise(*quantize_int4_groupwise(c, group))
            return float((x[:, cols] @ (dq - wg).t()).pow(2).sum())
        best = min(ratios, key=err)
        expect = wg.clamp(float(wg.min()) * best, float(wg.max()) * best) if best < 1 else wg
        assert torch.allclose(clipped[row:row + 1, cols], expect), (row, g, best)


def test_awq_module_divides_its_input_and_beats_rtn_on_the_sample():
    k = 128
    x = correlated_inputs(256, k)
    lin = nn.Linear(k, 64)
    awq = search_space.get("int4_wo(group_size=32, algorithm=awq)").build(lin, stats_of(x))
    rtn = search_space.get("int4_wo(group_size=32)").build(lin)
    scale = awq.canonical()["act_scale"]
    assert scale.shape == (k,) and not torch.equal(scale, torch.ones(k))
    with torch.no_grad():
        ref = lin(x)
        assert torch.allclose(awq(x), awq.reference(x), atol=1e-4)
        assert (awq(x) - ref).pow(2).sum() < (rtn(x) - ref).pow(2).sum()


##### SmoothQuant ###############################################################################

def test_smoothquant_migration_computes_the_same_function_before_quantization():
    k = 96
    w, x = weight(40, k), correlated_inputs(128, k)
    s = algorithms.smoothquant_scale(w, x.abs().amax(0))
    expect = x.abs().amax(0).pow(0.5) / w.abs().amax(0).pow(0.5)
    assert torch.allclose(s, expect, rtol=2 ** -8)  # rounded to bf16
    migrated = (x.double() / s.double()) @ (w.double() * s.double()).t()
    assert torch.allclose(migrated, x.double() @ w.double().t(), rtol=1e-12, atol=1e-12)
    # and it evens out the ranges: the largest activation channel shrinks
    assert (x / s).abs().amax() < x.abs().amax()


@pytest.mark.parametrize("family", ["int8_dyn", "sparse24_int8_dyn"])
def test_smoothquant_beats_rtn_on_outlier_activations(family):
    k = 128
    x = correlated_inputs(256, k)
    lin = nn.Linear(k, 64, bias=False)
    st = stats_of(x)
    sq = search_space.get(family, algorithm="smoothquant").build(lin, st)
    rtn = search_space.get(family).build(lin, st)
    if family.startswith("sparse24"):  # the same Wanda mask: only the int8 error differs
        assert torch.equal(sq.canonical()["qweight"] != 0, rtn.canonical()["qweight"] != 0)
    with torch.no_grad():
        w = rtn.canonical()["qweight"].float() * rtn.canonical()["scale"][:, None] if family.startswith("sparse") \
            else lin.weight
        ref = x @ (w if not family.startswith("sparse") else (lin.weight * (rtn.canonical()["qweight"] != 0))).t()
        assert (sq(x) - ref).pow(2).sum() < (rtn(x) - ref).pow(2).sum()


##### HQQ #######################################################################################

def test_hqq_weight_error_is_at_most_rtns_in_every_group():
    g = 32
    w = weight(64, 256) + 0.02 * torch.randn(64, 256).pow(3)  # heavy-tailed, where l_p < 1 fits pay
    q, s, z = algorithms.hqq_int4(w, g)
    rq = quantize_int4_groupwise(w, g)
    assert torch.equal(s, rq[1])  # HQQ refines zero points only
    e = (dequantize_int4_groupwise(q, s, z) - w).pow(2).reshape(-1, g).sum(1)
    e_rtn = (dequantize_int4_groupwise(*rq) - w).pow(2).reshape(-1, g).sum(1)
    assert (e <= e_rtn + 1e-12).all()
    assert e.sum() < e_rtn.sum()


##### modules, candidates, plans ################################################################

def test_without_statistics_every_algorithm_is_rtn():
    lin = nn.Linear(64, 32)
    rtn = search_space.get("int4_wo(group_size=32)").build(lin).canonical()
    for alg in ("gptq", "awq"):
        c = search_space.get("int4_wo", group_size=32, algorithm=alg).build(lin).canonical()
        assert all(torch.equal(c[name], rtn[name]) for name in rtn)
    assert torch.equal(search_space.get("int8_dyn(algorithm=smoothquant)").build(lin).canonical()["act_scale"],
                       torch.ones(64))


def test_names_timing_fusion_and_calibration_needs():
    rtn = search_space.get("int4_wo", group_size=64)
    gptq, awq = (search_space.get("int4_wo", group_size=64, algorithm=a) for a in ("gptq", "awq"))
    assert rtn.name == "int4_wo(group_size=64)" and rtn.algorithm == "rtn"
    assert gptq.name == "int4_wo(group_size=64, algorithm=gptq)"
    assert gptq.timing_name == rtn.name and awq.timing_name == awq.name  # AWQ's x / s is a cost to time
    assert gptq.fusable and not awq.fusable
    # an input scale [K] is not a row of the output: no input-scaled layer fuses with its siblings
    smooth = [search_space.get(f"{f}(algorithm=smoothquant)") for f in ("int8_dyn", "sparse24_int8_dyn")
              if "smoothquant" in getattr(search_space.get(f).module_cls, "algorithms", ())]
    assert smooth and not any(c.fusable for c in smooth) and search_space.get("int8_dyn").fusable
    assert gptq.calibration_uses == {"sample"} and {"act_mean", "sample"} <= awq.calibration_uses
    assert search_space.get("int8_dyn(algorithm=smoothquant)").calibration_uses == {"act_absmax"}
    with pytest.raises(ValueError, match="did you mean 'gptq'"):
        search_space.get("int4_wo", group_size=64, algorithm="gtpq")
    with pytest.raises(ValueError, match="rtn, smoothquant"):
        search_space.get("int8_dyn", algorithm="gptq")


def test_fits_are_memoized_on_the_statistics(monkeypatch):
    lin = nn.Linear(64, 32)
    st = stats_of(correlated_inputs(128, 64))
    cand = search_space.get("int4_wo(group_size=32, algorithm=gptq)")
    first = cand.build(lin, st).canonical()
    monkeypatch.setattr(algorithms, "gptq_int4", lambda *a, **k: (_ for _ in ()).throw(AssertionError("refit")))
    again = cand.build(lin, st).canonical()
    assert all(torch.equal(first[n], again[n]) for n in first)
    with torch.no_grad():
        lin.weight.add_(0.1)  # another weight: fitted anew
    with pytest.raises(AssertionError, match="refit"):
        cand.build(lin, st)


def test_plan_json_names_the_algorithm_and_old_plans_load_as_rtn(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32, bias=False))
    x = correlated_inputs(64, 64)
    calib = profile(model, [x[:32], x[32:]]).calibration
    plan = autoao.Plan.for_model(model, {"0": search_space.get("int4_wo(group_size=32, algorithm=gptq)"),
                                         "2": search_space.get("int4_wo(group_size=32, algorithm=awq)")})
    d = json.loads(plan.to_json())
    assert d["layers"]["0"] == {"family": "int4_wo", "params": {"group_size": 32, "algorithm": "gptq"}}
    assert autoao.Plan.from_json(plan.to_json()).layers == plan.layers
    d["layers"]["0"]["params"].pop("algorithm")  # a plan written before algorithms existed
    assert autoao.Plan.from_dict(d).layers["0"] == search_space.get("int4_wo(group_size=32)")
    # applied with calibration, saved, loaded into a fresh copy: bit-exact, algorithms recorded
    fresh = __import__("copy").deepcopy(model)
    autoao.apply(model, plan, calibration=calib)
    autoao.save(model, tmp_path)
    for p in fresh.parameters():
        nn.init.normal_(p)
    autoao.load(fresh, tmp_path)
    with torch.no_grad():
        assert torch.equal(model(x), fresh(x))
    assert autoao.plan_of(fresh).layers == plan.layers


def test_layer_errors_fit_on_some_rows_and_measure_on_the_others(monkeypatch):
    tiny = build()
    model, prof = tiny["model"], profile(tiny["model"], tiny["example_inputs"])
    seen: list[int] = []
    real = algorithms.gptq_int4

    def spy(w, g, h, damp=algorithms.GPTQ_DAMP):
        seen.append(1)
        return real(w, g, h, damp)

    monkeypatch.setattr(algorithms, "gptq_int4", spy)
    rows = prof.layers[0].stats.sample.shape[0]
    split = heldout_split(rows)
    assert 0 < split < rows
    built: list[int] = []
    orig = search_space.get("int4_wo(group_size=32)").__class__.build

    def record(self, linear, stats=None, fqn=""):
        if self.algorithm != "rtn":
            built.append(stats.sample.shape[0])
        return orig(self, linear, stats, fqn)

    monkeypatch.setattr(search_space.get("int4_wo(group_size=32)").__class__, "build", record)
    cands = [search_space.get("int4_wo(group_size=32)"), search_space.get("int4_wo(group_size=32, algorithm=gptq)")]
    errs = layer_errors(model, prof, cands, progress=False)
    assert built and set(built) == {split}  # fitted on the first rows only
    assert seen and all(len(per) == 2 for per in errs.values())


def test_a_tiny_search_chooses_among_gptq_awq_and_rtn(tmp_path, monkeypatch):
    import autoao.kernels
    import autoao.reports
    from autoao import api
    from autoao.evaluators import harness
    from autoao.evaluators.timing import Timing

    # timings as data: RTN and GPTQ share one cell (same kernels); AWQ pays for its x / s
    timed: list[str] = []

    def fake(cand, kern, n, k, tokens, *a):
        timed.append(cand.name)
        return {m: Timing({"bf16": 400.0}.get(cand.family, 300.0 if cand.algorithm == "awq" else 200.0), 0, 0, 5)
                for m in tokens}

    monkeypatch.setattr(harness, "time_missing", fake)
    from autoao.stages import anchors, bench, measure  # end-to-end times as data too: 1000 us unchanged, 500 us with any plan

    # the cells as timed, compared below: a measured uniform plan anchors nothing
    monkeypatch.setattr(anchors, "anchor", lambda cost, name, plan, speedup, rounds: anchors.AnchorRecord(
        name, len(plan.layers), rounds, speedup, speedup, 1.0))

    def whole(model, examples, *a, **kw):
        return (500.0,) * 3 if any(isinstance(m, autoao.kernels.QuantizedLinear) for m in model.modules()) else (1000.0,) * 3

    monkeypatch.setattr(bench, "forward_timing", whole)
    monkeypatch.setattr(measure, "forward_timing", whole)
    monkeypatch.setenv("AUTOAO_CACHE_DIR", str(tmp_path / "cache"))
    tiny = build()
    cands = ["int4_wo(group_size=32)", "int4_wo(group_size=32, algorithm=gptq)",
             "int4_wo(group_size=32, algorithm=awq)"]
    result = api.optimize(tiny["model"], tiny["example_inputs"], eval_inputs=tiny["eval_inputs"], budget=6,
                          candidates=cands, max_accuracy_drop=1.0, out_dir=tmp_path / "out", progress=False)
    assert not any("gptq" in name for name in timed)  # GPTQ read RTN's timings
    assert any("awq" in name for name in timed)
    assert set(result.summary.algorithm_seconds) >= {"gptq", "awq"}
    assert "calibrated fits" in (tmp_path / "out" / "report.html").read_text()  # their seconds, in the report
    assert autoao.Plan.load(tmp_path / "out" / "plan.json").layers == result.plan.layers
    # every layer has a tier-0 error and a timing for each algorithm, and may pick any of them
    layers = autoao.reports.load(tmp_path / "out").context.layers
    assert len(layers) == 15
    for lay in layers:
        assert set(cands) <= set(lay.sqnr_db) and set(cands) <= set(lay.time_us) and set(cands) <= set(lay.choices)
        assert lay.time_us[cands[1]] == lay.time_us[cands[0]] < lay.time_us[cands[2]]


@pytest.mark.parametrize("name", ["int4_wo(group_size=32, algorithm=gptq)", "int4_wo(group_size=32, algorithm=awq)",
                                  "int8_dyn(algorithm=smoothquant)"])
def test_a_calibrated_plan_is_refused_without_its_statistics(name):
    """Without the statistics its algorithm fits on, apply would quietly build round-to-nearest
    weights: it refuses, naming the layer and what is missing, and changes nothing."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32)).to(torch.bfloat16)
    plan = autoao.Plan.uniform(model, name)
    with pytest.raises(autoao.PlanError, match=r"(?s)calibration=.*  0: .*fits on"):
        autoao.apply(model, plan)
    assert isinstance(model[0], nn.Linear)  # untouched
    x = torch.randn(1, 64, 64).to(torch.bfloat16)
    autoao.apply(model, plan, calibration=profile(model, [x]).calibration)
    assert model[0].algorithm == search_space.get(name).algorithm
    # HQQ fits on the weight alone: no statistics needed
    other = nn.Sequential(nn.Linear(64, 32)).to(torch.bfloat16)
    autoao.apply(other, autoao.Plan.uniform(other, "int4_wo(group_size=32, algorithm=hqq)"))
