"""Timing and its on-disk cache: measured once, reused, safe under concurrency and corruption."""

from __future__ import annotations

import dataclasses
import math
import re
import subprocess
import sys
import textwrap

import pytest
import torch

from autoao import clock
from autoao import search_space
from autoao.cli import main
from autoao.evaluators import harness, order, timing
from autoao.evaluators.cache import ResultCache, TimingCache, TimingKey
from autoao.evaluators.sensitivity import layer_errors
from autoao.evaluators.timing import Timing, measure_latencies
from autoao.kernels import KernelInfo, cuda_int4
from autoao.stages.inputs import build_inputs
from autoao.stages.measure import probe_errors

SMALL = [search_space.get("bf16"), search_space.get("int8_dyn"), search_space.get("int4_wo(group_size=64)"),
         search_space.get("sparse24")]


def cuda_kernel(cand: str, kernel: str) -> KernelInfo:
    """`cand`'s CUDA kernel `kernel` (Candidate.kernels; a CUDA device object needs no GPU)."""
    return next(k for k in search_space.get(cand).kernels("cuda") if k.name == kernel)


def run_cuda_kernels(monkeypatch, cand, names: tuple[str, ...] | None = None) -> None:
    """Timing on this CPU is told that `cand` runs its CUDA kernels (those in `names`), records
    made afresh on each call as Candidate.kernels makes them."""
    own = type(cand).kernels
    monkeypatch.setattr(type(cand), "kernels", lambda self, device: tuple(
        k for k in own(self, "cuda") if names is None or k.name in names))


def key(i: int) -> TimingKey:
    return TimingKey("cpu", "2.13", "3.9", "0.1", "int8_dyn", i, 64, 32, "bfloat16", "eager")


def test_second_measurement_runs_no_kernel(tmp_path, monkeypatch):
    """The second identical measurement is served from the cache: zero kernel timings (but for
    cells the first could not measure cleanly, which are measured again: never reused as clean)."""
    cache = TimingCache(tmp_path / "t.sqlite")
    first = measure_latencies([(32, 64)], [1, 4], SMALL, cache=cache, progress=False)
    # every candidate supports N=32, K=64 on CPU: each timed at both M, on at least one kernel
    assert first.measured >= 2 * len(SMALL)
    # a busy machine: mark every stored cell clean (each kernel's), as a quiet re-measurement would
    cache._conn.execute("UPDATE timings SET reliable = 1")
    calls = []
    monkeypatch.setattr(harness, "time_module", lambda *a, **k: calls.append(a) or Timing.failed("should not run"))
    again = measure_latencies([(32, 64)], [1, 4], SMALL, cache=TimingCache(tmp_path / "t.sqlite"), progress=False)
    assert again.measured == 0 and calls == []
    assert all(r.cached for r in again.rows)
    # where the time went: every candidate measured the first time, nothing the second
    assert {label.split("@")[0] for label in first.seconds_by_kernel} == {c.name for c in SMALL}
    assert all(sec > 0 for sec in first.seconds_by_kernel.values()) and again.seconds_by_kernel == {}
    for a, b in zip(first.rows, again.rows):
        assert a.timing.median_us == b.timing.median_us or not a.timing.ok


def test_unsupported_emulated_and_failing_candidates_are_data(tmp_path, monkeypatch):
    cache = TimingCache(tmp_path / "t.sqlite")
    table = measure_latencies([(20, 64)], [2], SMALL, cache=cache, progress=False)
    int4 = table.get("int4_wo(group_size=64)", 2, 64, 20)
    assert not int4.ok and "unsupported" in int4.error and "N=20" in int4.error
    sparse = table.get("sparse24", 2, 64, 20)
    assert sparse.ok and sparse.emulated and "emulated" in sparse.emulated

    def boom(*a, **k):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(search_space.get("int8_dyn").module_cls, "_forward", boom)
    failed = measure_latencies([(48, 64)], [3], [search_space.get("int8_dyn")], cache=cache, progress=False)
    t = failed.get("int8_dyn", 3, 64, 48)
    assert math.isinf(t.median_us) and "kernel exploded" in t.error
    # the failure is cached too, for each kernel of the candidate (a failing kernel is not retried
    # on every run)
    labels = [name if kern is None else f"{name}@{kern}" for name in ["int8_dyn"]
              for kern in timing.kernel_names(search_space.get(name), torch.device("cpu"))]
    stored = [TimingCache(tmp_path / "t.sqlite").get(_key_for(failed, label, 3, 64, 48)) for label in labels]
    assert stored and all(s is not None and "kernel exploded" in s.error for s in stored)


def _key_for(table, cand, m, k, n) -> TimingKey:
    import autoao
    import triton

    from autoao.evaluators.timing import HARNESS_VERSION

    return TimingKey(table.device, torch.__version__, triton.__version__, f"{autoao.__version__}/harness-{HARNESS_VERSION}",
                     cand, m, k, n, table.dtype, table.mode)


def test_launch_options_are_part_of_the_key(tmp_path):
    """A timing cached under one kernel-option setting is never returned under another; a key
    without options hashes as keys did before the field existed."""
    plain = key(1)
    assert plain.options == "" and "options" not in plain.fields()
    assert plain.digest() == "91e1804a2b95076ee8480246d903faf64c1ad53e0aeb7ebf66b90b7e16f8de47"  # as before
    on, off = (dataclasses.replace(plain, options=cuda_int4.LaunchOptions(pdl=pdl).tag()) for pdl in (True, False))
    assert len({plain.digest(), on.digest(), off.digest()}) == 3
    cache = TimingCache(tmp_path / "t.sqlite")
    cache.put(on, Timing(5.0, 4.0, 6.0, 10))
    assert cache.get(on).median_us == 5.0 and cache.get(off) is None and cache.get(plain) is None


def test_measure_latencies_keys_the_cuda_int4_kernel_by_its_launch_options(tmp_path, monkeypatch):
    # the CUDA int4 kernel's options, exercised on the CPU: timing is told the candidate's one
    # kernel is "cuda" (on the CPU that is the CPU path; what matters is the key it is cached under)
    int4 = search_space.get("int4_wo(group_size=64)")
    assert cuda_kernel(int4.name, "tinygemm").options == "" and all(k.options == "" for k in int4.kernels("cpu"))
    assert search_space.get("int8_dyn").kernels("cuda")[0].options == ""
    run_cuda_kernels(monkeypatch, int4, ("cuda",))
    cache = TimingCache(tmp_path / "t.sqlite")

    def measure():
        return measure_latencies([(32, 64)], [1], [int4], cache=cache, progress=False).measured

    assert measure() == 1 and measure() == 0  # measured once, then served from the cache
    with cuda_int4.launch_options(pdl=not cuda_int4.OPTIONS.pdl):
        assert cuda_kernel(int4.name, "cuda").options == cuda_int4.OPTIONS.tag()
        assert measure() == 1 and measure() == 0  # another setting: measured again, cached apart
    with cuda_int4.launch_options(prefetch_mb=cuda_int4.OPTIONS.prefetch_mb + 8):
        assert measure() == 1
    assert measure() == 0  # the first setting's timing is still there


def test_nan_output_scores_inf(tmp_path):
    lin = torch.nn.Linear(16, 8)
    with torch.no_grad():
        lin.weight.fill_(float("nan"))
    t = timing.time_module(lin, 2, 16, torch.float32, torch.device("cpu"))
    assert not t.ok and "NaN" in t.error


def test_two_processes_writing_at_once_lose_nothing(tmp_path):
    path = tmp_path / "t.sqlite"
    TimingCache(path).close()  # create the file and schema first
    code = textwrap.dedent(f"""
        import sys
        from autoao.evaluators.cache import TimingCache, TimingKey
        from autoao.evaluators.timing import Timing
        c = TimingCache({str(path)!r})
        off = int(sys.argv[1])
        for i in range(off, off + 300):
            c.put(TimingKey("cpu", "t", "t", "a", "int8_dyn", i, 64, 32, "bf16", "eager"), Timing(i, i, i, 1))
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code, str(off)]) for off in (0, 300)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    cache = TimingCache(path)
    assert len(cache) == 600
    assert cache.get(TimingKey("cpu", "t", "t", "a", "int8_dyn", 457, 64, 32, "bf16", "eager")).median_us == 457


def test_corrupt_cache_file_is_set_aside(tmp_path):
    path = tmp_path / "t.sqlite"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.warns(UserWarning, match="unreadable"):
        cache = TimingCache(path)
    cache.put(key(1), Timing(5.0, 4.0, 6.0, 10))
    assert cache.get(key(1)).median_us == 5.0
    assert any(p.name.startswith("t.sqlite.corrupt-") for p in tmp_path.iterdir())


def test_failed_timing_round_trips_as_inf(tmp_path):
    cache = TimingCache(tmp_path / "t.sqlite")
    cache.put(key(2), Timing.failed("unsupported: nope"))
    t = cache.get(key(2))
    assert math.isinf(t.median_us) and t.error == "unsupported: nope" and not t.ok


def test_cli_kernels_table(tmp_path, capsys):
    rc = main(["kernels", "--shapes", "32x64", "--tokens", "1,4", "--device", "cpu", "--quiet",
               "--candidates", "int8_dyn,int4_wo(group_size=32),sparse24", "--cache-dir", str(tmp_path),
               "--csv", str(tmp_path / "k.csv")])
    out = capsys.readouterr().out
    assert rc == 0
    assert "32x64 (N x K)" in out and "bf16" in out  # the baseline is always added
    assert "emulated: 2:4 has no CPU kernel" in out
    # 4 candidates x 2 token counts, some of them on several CPU kernels: one CSV row per cell
    measured = int(re.search(r"(\d+) kernel timings measured", out).group(1))
    assert measured >= 8
    assert (tmp_path / "k.csv").read_text().count("\n") == 1 + 8
    # only timings the first run could not take cleanly (a busy machine) are measured again; counted
    # before the second run, which replaces the ones it re-measures
    unreliable = sum(d.unreliable for d in TimingCache(tmp_path / "timings.sqlite").devices())
    rc = main(["kernels", "--shapes", "32x64", "--tokens", "1,4", "--device", "cpu", "--quiet",
               "--candidates", "int8_dyn,int4_wo(group_size=32),sparse24", "--cache-dir", str(tmp_path)])
    again = capsys.readouterr().out
    remeasured = int(re.search(r"(\d+) kernel timings measured, \d+ of 8 results from the cache", again).group(1))
    assert remeasured <= unreliable, again


def test_cli_kernels_all_kernels_lists_every_kernel_timed(tmp_path, capsys, monkeypatch):
    # A candidate with several CUDA kernels: --all-kernels adds a row per kernel timed (the chosen
    # one marked) and writes one CSV row per kernel; without it, only the chosen kernel's row.
    run_cuda_kernels(monkeypatch, search_space.get("int4_wo(group_size=32)"), ("tinygemm", "cuda"))
    monkeypatch.setattr(harness, "time_missing", lambda cand, kern, n, k, tokens, *a: {
        m: Timing({"tinygemm": 9.0, "cuda": 6.0}.get(kern, 20.0) * m, 0, 0, 5) for m in tokens})
    argv = ["kernels", "--shapes", "32x64", "--tokens", "1,4", "--device", "cpu", "--quiet",
            "--candidates", "int4_wo(group_size=32)", "--cache-dir", str(tmp_path)]
    assert main([*argv, "--all-kernels", "--csv", str(tmp_path / "all.csv")]) == 0
    out = capsys.readouterr().out
    assert "  @tinygemm" in out and "  @cuda" in out
    assert "6 kernel timings measured, 0 of 4 results from the cache" in out  # bf16 + 2 int4 kernels, M 1 and 4
    chosen = [line for line in out.splitlines() if line.strip().startswith("@") and line.endswith("chosen")]
    assert len(chosen) == 1 and chosen[0].strip().startswith("@cuda")
    assert "6.0us 3.33x" in chosen[0] and "24.0us 3.33x" in chosen[0]  # vs bf16: 20 us x M
    csv_rows = (tmp_path / "all.csv").read_text().splitlines()
    int4_rows = [r for r in csv_rows if r.split(",")[3] == "int4_wo(group_size=32)"]
    assert len(int4_rows) == 4 and sorted(r.rsplit(",", 2)[1:] for r in int4_rows) == \
        [["cuda", "1"], ["cuda", "1"], ["tinygemm", "0"], ["tinygemm", "0"]]
    assert main([*argv, "--csv", str(tmp_path / "chosen.csv")]) == 0
    assert "@tinygemm" not in capsys.readouterr().out
    assert (tmp_path / "chosen.csv").read_text().count("int4_wo") == 2


@pytest.mark.parametrize("argv, message", [
    (["kernels", "--shapes", "4096by4096"], "bad --shapes entry"),
    (["kernels", "--tokens", "1,x"], "bad --tokens"),
    (["kernels", "--candidates", "int4"], "Did you mean: int4_wo"),
    (["kernels", "--device", "tpu"], "bad --device"),
    (["kernels", "--dtype", "int7"], "bad --dtype"),
    (["kernels", "--mode", "graph", "--device", "cpu", "--shapes", "32x64"], "needs a CUDA device"),
])
def test_cli_bad_input_exits_2_with_one_line(argv, message, capsys, tmp_path):
    rc = main([*argv, "--cache-dir", str(tmp_path), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2
    assert message in err and err.startswith("autoao: error:") and err.count("\n") == 1


def test_pick_kernel_minimises_total_time_over_the_workload():
    t = lambda us: timing.Timing(us, us, us, 5)  # noqa: E731
    failed = timing.Timing.failed("boom")
    # faster at M=1, much slower at M=2048: the total decides (one module serves both)
    assert timing.pick_kernel({"a": {1: t(10), 2048: t(100)}, "b": {1: t(5), 2048: t(300)}}) == "a"
    assert timing.pick_kernel({"a": {1: t(10)}, "b": {1: t(5)}}) == "b"
    # weighted by the workload: 32 decode steps and one prefill favour the decode-fast kernel
    two = {"a": {1: t(10), 2048: t(100)}, "b": {1: t(5), 2048: t(130)}}
    assert timing.pick_kernel(two) == "a" and timing.pick_kernel(two, {1: 32, 2048: 1}) == "b"
    assert timing.pick_kernel({"a": {1: failed}, "b": {1: t(50)}}) == "b"  # a failure never wins
    assert timing.pick_kernel({"a": {1: t(7)}, "b": {1: t(7)}}) == "a"  # ties: the default (first)
    assert timing.pick_kernel({"a": {1: t(10.1)}, "b": {1: t(10)}}) == "a"  # within 2%: still the first
    assert timing.pick_kernel({"a": {1: t(10.5)}, "b": {1: t(10)}}) == "b"
    assert timing.pick_kernel({"a": {1: failed}, "b": {1: failed}}) == "a"  # nothing ran: the default
    assert timing.pick_kernel({None: {1: t(3)}}) is None


def test_kernel_names_are_the_devices_and_only_with_a_choice():
    int4 = search_space.get("int4_wo", group_size=128)
    assert timing.kernel_names(int4, torch.device("cpu")) == ("tinygemm_cpu", "dequant")
    assert timing.kernel_names(search_space.get("int8_dyn(act=tensor)"), torch.device("cpu")) == ("fbgemm", "onednn")
    assert timing.kernel_names(search_space.get("fp8_wo"), torch.device("cpu")) == (None,)
    assert timing.kernel_names(int4, torch.device("cuda")) == ("tinygemm", "cuda", "triton", "tinygemm_dequant")
    assert timing.kernel_names(search_space.get("fp8_wo"), torch.device("cuda")) == (None,)
    assert timing.kernel_names(search_space.get("bf16"), torch.device("cuda")) == (None,)


def test_a_kernel_running_another_kernels_code_is_not_timed_again(tmp_path, monkeypatch):
    # int4's tinygemm_dequant is tinygemm's GEMV up to 8 rows and the Triton kernel's dequantize +
    # F.linear above the rows Triton's GEMV takes: it reuses their numbers at those M, and is timed
    # itself only in between (here M=16, which Triton's tensor-core GEMV takes on K=4096, g=128).
    # int8_wo's "dequant" is "triton" above 8 rows.
    from autoao.kernels import int4 as int4_mod
    from autoao.kernels import triton_gemv

    monkeypatch.setattr(int4_mod, "load_triton_ops", lambda: True)
    limit = triton_gemv.int4_max_rows(4096, 128)
    assert limit >= 8
    dequant = cuda_kernel("int4_wo(group_size=128)", "tinygemm_dequant")
    assert dequant.same_code(1, 1024, 4096) == "tinygemm"
    assert dequant.same_code(2048, 1024, 4096) == "triton"
    assert dequant.same_code(limit, 1024, 4096) is None  # Triton's GEMV
    assert cuda_kernel("int4_wo(group_size=128)", "cuda").same_code(1, 1024, 4096) is None
    monkeypatch.setattr(int4_mod, "load_triton_ops", lambda: False)  # "triton" is tinygemm then
    assert dequant.same_code(2048, 1024, 4096) is None

    from autoao.kernels import int8 as int8_mod

    monkeypatch.setattr(int8_mod, "load_triton_ops", lambda: True)
    i8 = cuda_kernel("int8_wo", "dequant")
    assert i8.same_code(2048, 64, 64) == "triton" and i8.same_code(8, 64, 64) is None
    assert cuda_kernel("int8_wo", "triton").same_code(2048, 64, 64) is None
    assert all(k.same_code(2048, 64, 64) is None for k in search_space.get("int8_wo").kernels("cpu"))
    monkeypatch.setattr(int8_mod, "load_triton_ops", lambda: False)  # then "triton" is the F.linear at every M
    assert i8.same_code(1, 64, 64) == "triton"

    monkeypatch.setattr(int4_mod, "load_triton_ops", lambda: True)
    int4 = search_space.get("int4_wo", group_size=128)
    timed = []

    def fake_time(cand, kern, n, k, tokens, dtype, device, mode, *sampling):
        timed.append((kern, tuple(tokens)))
        return {m: Timing(float(m) + len(kern), 0, 0, 5) for m in tokens}

    run_cuda_kernels(monkeypatch, int4)
    monkeypatch.setattr(harness, "time_missing", fake_time)
    tokens = [1, limit, 2048]
    table = measure_latencies([(1024, 4096)], tokens, [int4], cache=TimingCache(tmp_path / "t.sqlite"),
                              progress=False)
    assert timed == [("tinygemm", (1, limit, 2048)), ("cuda", (1, limit, 2048)), ("triton", (1, limit, 2048)),
                     ("tinygemm_dequant", (limit,))]
    got = table.kernel_timings[(int4.name, 4096, 1024)]
    assert got["tinygemm_dequant"][1].median_us == got["tinygemm"][1].median_us
    assert got["tinygemm_dequant"][2048].median_us == got["triton"][2048].median_us


def test_a_kernel_outrun_at_every_m_by_one_that_ran_is_not_timed(tmp_path, monkeypatch):
    # int4's "triton" loses to "cuda" at M <= 8 and above the rows Triton's GEMV takes: with
    # tokens [1, 2048] it is not timed once "cuda" has run, and tinygemm_dequant, whose M = 2048
    # code is Triton's, is then timed itself. If "cuda" failed (no nvcc), "triton" is timed.
    from autoao.kernels import int4 as int4_mod
    from autoao.kernels import triton_gemv

    monkeypatch.setattr(int4_mod, "load_triton_ops", lambda: True)
    limit = triton_gemv.int4_max_rows(4096, 128)
    triton = cuda_kernel("int4_wo(group_size=128)", "triton")
    assert [triton.outrun_by(m, 1024, 4096) for m in (1, 8, limit, 2048)] == ["cuda", "cuda", None, "cuda"]
    assert cuda_kernel("int4_wo(group_size=128)", "cuda").outrun_by(1, 1024, 4096) is None
    int4 = search_space.get("int4_wo", group_size=128)
    run_cuda_kernels(monkeypatch, int4)
    for cuda_runs in (True, False):
        timed = []

        def fake_time(cand, kern, n, k, tokens, dtype, device, mode, *sampling):
            timed.append(kern)
            if kern == "cuda" and not cuda_runs:
                return {m: Timing.failed("RuntimeError: no nvcc") for m in tokens}
            return {m: Timing(float(m) + len(kern), 0, 0, 5) for m in tokens}

        monkeypatch.setattr(harness, "time_missing", fake_time)
        table = measure_latencies([(1024, 4096)], [1, 2048], [int4], cache=TimingCache(tmp_path / f"{cuda_runs}.sqlite"),
                                  progress=False)
        got = table.kernel_timings[(int4.name, 4096, 1024)]
        if cuda_runs:
            assert timed == ["tinygemm", "cuda", "tinygemm_dequant"] and "triton" not in got
        else:
            assert timed == ["tinygemm", "cuda", "triton"]
            assert got["tinygemm_dequant"][2048].median_us == got["triton"][2048].median_us


def test_single_op_kernels_are_named_per_m(monkeypatch):
    # A kernel whose forward is one opaque op at M (a custom op or an extern aten kernel) is what
    # compile-mode timing runs eagerly in a CUDA graph; anything that is two ops, or Python around
    # one, is compiled as the plan will run.
    from autoao.kernels import fp8 as fp8_mod
    from autoao.kernels import int4 as int4_mod
    from autoao.kernels import int8 as int8_mod
    from autoao.kernels import triton_gemv

    monkeypatch.setattr(int4_mod, "load_triton_ops", lambda: True)
    i4 = "int4_wo(group_size=128)"
    limit = triton_gemv.int4_max_rows(4096, 128)
    ms = (1, 8, limit, 2048)
    assert [cuda_kernel(i4, "tinygemm").single_op(m, 1024, 4096) for m in ms] == [True] * 4
    assert [cuda_kernel(i4, "cuda").single_op(m, 1024, 4096) for m in ms] == [True, True, False, False]
    assert [cuda_kernel(i4, "tinygemm_dequant").single_op(m, 1024, 4096) for m in ms] == [True, True, False, False]
    assert [cuda_kernel(i4, "triton").single_op(m, 1024, 4096) for m in ms] == [True, True, True, False]
    monkeypatch.setattr(int4_mod, "load_triton_ops", lambda: False)  # "triton" runs tinygemm's op then
    assert cuda_kernel(i4, "triton").single_op(2048, 1024, 4096)
    for mod, cand in ((int8_mod, "int8_wo"), (fp8_mod, "fp8_wo")):
        monkeypatch.setattr(mod, "load_triton_ops", lambda: True)
        assert [cuda_kernel(cand, "triton").single_op(m, 64, 64) for m in (1, 8, 9, 2048)] == [True, True, False, False]
        monkeypatch.setattr(mod, "load_triton_ops", lambda: False)  # then the dequantize + F.linear
        assert not cuda_kernel(cand, "triton").single_op(1, 64, 64)
    assert not cuda_kernel("int8_wo", "dequant").single_op(1, 64, 64)
    assert not cuda_kernel("int8_dyn", "default").single_op(1, 64, 64)  # quantize x, then a GEMM

    int4 = search_space.get("int4_wo", group_size=128)
    cuda = torch.device("cuda")  # only its type is read
    assert timing.single_op_tokens(int4, "cuda", 1024, 4096, [1, 2048], cuda, "compile") == {1}
    assert timing.single_op_tokens(int4, "cuda", 1024, 4096, [1, 2048], cuda, "graph") == set()
    assert timing.single_op_tokens(int4, "cuda", 1024, 4096, [1, 2048], torch.device("cpu"), "compile") == set()
    monkeypatch.setattr(fp8_mod, "load_triton_ops", lambda: True)
    fp8 = search_space.get("fp8_wo")  # one kernel: kernel None
    assert timing.single_op_tokens(fp8, None, 64, 64, [1, 2048], cuda, "compile") == {1}


def test_compile_mode_compiles_only_for_the_m_that_are_not_one_op(monkeypatch):
    # The single-op M are timed on the eager module; torch.compile is called (once) only when some
    # M is left, and the compiled module only ever sees those M (dynamo compiles per M it sees).
    compiled_calls, compiles = [], []

    def fake_compile(module, **kwargs):
        compiles.append(module)

        def run(x):
            compiled_calls.append(x.shape[0])
            return module(x)
        return run

    def fake_time(fn, m, k, dtype, device, graph, **sampling):
        fn(torch.zeros(m, k))  # a compiled module compiles (here: counts) on the M it sees
        return Timing(1.0, 1.0, 1.0, 5)

    monkeypatch.setattr(torch, "compile", fake_compile)
    monkeypatch.setattr(harness, "time_module", fake_time)
    cand = search_space.get("int8_wo")
    for single, compiled_ms in (({1, 4}, []), ({1}, [4]), (set(), [1, 4])):
        compiled_calls.clear()
        compiles.clear()
        monkeypatch.setattr(harness, "single_op_tokens", lambda *a, single=single: single)
        got = harness.time_missing(cand, None, 32, 64, [1, 4], torch.float32, torch.device("cpu"), "compile")
        assert all(t.ok for t in got.values())
        assert compiled_calls == compiled_ms and len(compiles) == (1 if compiled_ms else 0)


def test_latency_table_reports_the_chosen_kernel_per_shape():
    t = lambda us, kern: timing.Timing(us, us, us, 5, kernel=kern)  # noqa: E731
    rows = [timing.LatencyRow("int4_wo(group_size=128)", m, 4096, 1024, t(9.0 * m, "tinygemm"), False)
            for m in (1, 2048)] + [timing.LatencyRow("bf16", m, 4096, 1024, t(10.0, None), False) for m in (1, 2048)]
    table = timing.LatencyTable("gpu", "bfloat16", "compile", rows, 4, 0.0)
    assert table.kernel_for("int4_wo(group_size=128)", 4096, 1024) == "tinygemm"
    assert table.kernel_for("bf16", 4096, 1024) is None
    assert table.kernel_for("int4_wo(group_size=128)", 4096, 4096) is None  # shape not timed


def test_optimize_puts_the_timed_kernels_in_the_plan():
    # bench.kernels_for maps each planned layer to the kernel timing chose for its shape, and the members
    # of a fusion to the one chosen for the fused shape (CUDA tables carry kernels; here a hand-made
    # table stands in for one); the workload weighs each shape's token counts for timing
    from torch import nn

    from autoao.stages.bench import kernels_for
    from autoao.plan import Plan
    from autoao.profile import profile
    from autoao.stages.inputs import Inputs

    class Siblings(nn.Module):  # a and b read the same input: one fused (96, 64) module
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(64, 32, bias=False), nn.Linear(64, 64, bias=False)
            self.c = nn.Linear(32, 64, bias=False)

        def forward(self, x):
            return self.c(self.a(x)) + self.b(x)

    model = Siblings()
    prof = profile(model, [torch.randn(1, 3, 64), torch.randn(1, 1, 64)])
    assert prof.siblings == [("a", "b")]

    def work(siblings):
        return Inputs(prof, [], None, (), siblings, torch.device("cpu"), torch.float32, [1, 3])

    assert work([]).shape_calls() == {(32, 64): {3: 1, 1: 1}, (64, 64): {3: 1, 1: 1}, (64, 32): {3: 1, 1: 1}}
    assert work(prof.siblings).shape_calls()[(96, 64)] == {3: 1, 1: 1}
    assert work([]).shapes == [(32, 64), (64, 32), (64, 64)] and work(prof.siblings).fused_shapes == [(96, 64)]
    int4 = search_space.get("int4_wo", group_size=32)
    t = lambda kern: timing.Timing(5.0, 5.0, 5.0, 5, kernel=kern)  # noqa: E731
    rows = [timing.LatencyRow(int4.name, m, k, n, t(kern), False) for m in (1, 3)
            for (n, k), kern in {(32, 64): "triton", (64, 64): "tinygemm", (64, 32): "tinygemm",
                                 (96, 64): "tinygemm_dequant"}.items()]
    table = timing.LatencyTable("gpu", "bfloat16", "compile", rows, 0, 0.0)
    plan = Plan({"a": int4, "b": int4, "c": int4})
    assert kernels_for(plan, prof, table) == {"a": "triton", "b": "tinygemm", "c": "tinygemm"}
    plan.fusions = [("a", "b")]
    assert kernels_for(plan, prof, table) == {"a": "tinygemm_dequant", "b": "tinygemm_dequant", "c": "tinygemm"}
    assert kernels_for(Plan({"a": search_space.get("bf16")}), prof, table) == {}  # no timing, no kernel


def test_cost_model_fuses_only_what_timing_measured_fused():
    # fused shapes are timed only for candidates that fuse (api.optimize): the cost model keeps the
    # others unfused, and counts a fused group once
    from torch import nn

    from autoao.cost import CostModel
    from autoao.plan import Plan
    from autoao.profile import profile

    class Pair(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(64, 32, bias=False), nn.Linear(64, 64, bias=False)

        def forward(self, x):
            return self.a(x).sum() + self.b(x).sum()

    prof = profile(Pair(), torch.randn(1, 2, 64))
    t = lambda us: timing.Timing(us, us, us, 5)  # noqa: E731
    table = timing.LatencyTable("cpu", "bfloat16", "eager", [
        timing.LatencyRow(c, 2, 64, n, t(us), False) for c, us in (("bf16", 10.0), ("int8_wo", 6.0)) for n in (32, 64)]
        + [timing.LatencyRow("int8_wo", 2, 64, 96, t(8.0), False)], 5, 0.0)
    cost = CostModel.build(prof, table)
    assert cost.fused_us == {("a", "b"): {"int8_wo": 8.0}}
    assert cost.fusion_pays(("a", "b"), "int8_wo") and not cost.fusion_pays(("a", "b"), "bf16")
    int8 = search_space.get("int8_wo")
    plan = Plan({"a": int8, "b": int8})
    assert cost.predict(plan) == 12.0 and cost.predict(Plan({"a": int8, "b": int8}, fusions=[("a", "b")])) == 8.0


def test_tuners_pick_the_fastest_option_that_ran(monkeypatch):
    # the kernel tuners' shared loop: options that do not apply (None) or fail in an expected way
    # are passed over; any other failure is a bug and propagates
    monkeypatch.setattr(clock, "tuning_us", lambda fn: fn())  # each launch "takes" what it returns
    us = {"a": 5.0, "b": 1.0, "c": 0.5, "d": 3.0, "e": 4.0}

    def run(option):
        if option == "b":
            return None  # e.g. wrong numbers
        if option == "c":
            raise RuntimeError("unsupported here")
        return lambda: us[option]

    assert clock.fastest("abcde", run, skip=(RuntimeError,)) == "d"
    assert clock.fastest("bc", run, skip=(RuntimeError,)) is None
    with pytest.raises(RuntimeError, match="unsupported"):
        clock.fastest("abcde", run)

    def fails_when_timed(option):
        def launch():
            raise ValueError("does not compile")
        return launch if option == "a" else (lambda: us[option])

    assert clock.fastest("ae", fails_when_timed, skip=(ValueError,)) == "e"


def test_a_paired_speed_up_bounds_what_the_rounds_show():
    import math

    from autoao.clock import paired_speedup

    steady = paired_speedup([1000.0, 1010.0, 990.0], [800.0, 800.0, 800.0])
    assert steady.estimate == pytest.approx(1.25, rel=1e-3) and 1.2 < steady.low < steady.estimate < steady.high < 1.3
    # a whole round slowed alike on both sides leaves the ratio, so the bound stays tight
    moved = paired_speedup([1000.0, 2000.0, 1500.0], [800.0, 1600.0, 1200.0])
    assert moved.low == pytest.approx(1.25)
    # a plan as often slower as faster is not shown faster, however many rounds
    coin = paired_speedup([1000.0] * 8, [900.0, 1100.0] * 4)
    assert coin.low < 1.0 < coin.high
    # one side disturbed in one round widens the interval
    hit = paired_speedup([1000.0, 1000.0, 3000.0], [800.0, 800.0, 800.0])
    assert hit.low < steady.low and hit.estimate > steady.estimate
    one = paired_speedup([1000.0], [500.0])
    assert one.estimate == pytest.approx(2.0) and one.low == 0.0 and math.isinf(one.high)
    with pytest.raises(ValueError):
        paired_speedup([], [])


##### a deadline: every cell coarsely first, heaviest first, then refined ########################

class _Clock:
    """time.perf_counter for evaluators.timing, advanced by the fake kernel timings only."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


def _fake_cells(monkeypatch, seconds: dict[bool, float]) -> tuple[_Clock, list[tuple[str, str | None, tuple, bool]]]:
    """Kernel timings as data, on a fake clock: each (candidate, kernel) timing takes seconds[coarse]
    per M; returns the clock and the timings asked for, as (candidate, kernel, (N, K), coarse)."""
    clock_ = _Clock()
    asked = []

    def fake(cand, kern, n, k, tokens, dtype, device, mode, max_seconds=timing.CELL_SECONDS, *rest):
        coarse = max_seconds < timing.CELL_SECONDS
        asked.append((cand.name, kern, (n, k), coarse))
        clock_.now += seconds[coarse] * len(tokens)
        return {m: Timing(10.0 * m + (5.0 if coarse else 0.0), 0, 0, 5, coarse=coarse) for m in tokens}

    monkeypatch.setattr(timing, "time", clock_)
    monkeypatch.setattr(harness, "time_missing", fake)
    return clock_, asked


CELLS = [search_space.get(c) for c in ("bf16", "int8_wo", "int8_dyn(act=tensor)", "fp32_compute")]
FUSED = [c for c in CELLS if c.fusable]  # int8_wo, fp32_compute
# calls per forward at each M: weights (calls x M x N x K) of 4.3M, 0.6M and, fused, 2.2M
SHAPE_CALLS = {(64, 32): {1: 64, 256: 8}, (32, 64): {1: 32, 256: 1}, (128, 32): {1: 32, 256: 2}}


def _probe_order(tmp_path, monkeypatch, fast: dict[str, float], deadline: float | None, name: str):
    """measure_latencies over CELLS on two shapes, each candidate in `fast` running that factor of
    the baseline's time, the rest as slow as it: the cells in the order they were asked for, and
    the table."""
    clock_, asked = _fake_cells(monkeypatch, {True: 0.1, False: 0.6})

    def fake(cand, kern, n, k, tokens, dtype, device, mode, max_seconds=timing.CELL_SECONDS, *rest):
        asked.append((cand.name, kern, (n, k)))
        clock_.now += 0.1 * len(tokens)
        us = 10.0 * fast.get(cand.name, 1.0)
        return {m: Timing(us * m, 0, 0, 5, coarse=max_seconds < timing.CELL_SECONDS) for m in tokens}

    monkeypatch.setattr(harness, "time_missing", fake)
    table = measure_latencies([(64, 32), (32, 64)], [1, 256], CELLS, cache=TimingCache(tmp_path / name),
                              progress=False, calls=SHAPE_CALLS, deadline=deadline)
    return asked, table


@pytest.mark.parametrize("fast", [{"int8_dyn(act=tensor)": 0.4}, {"fp32_compute": 0.4},
                                  {"int8_dyn(act=tensor)": 0.4, "int8_wo": 0.8}])
def test_a_probe_faster_than_the_baseline_is_timed_on_every_shape_next(tmp_path, monkeypatch, fast):
    """After the baseline, the candidates' probes (their heaviest shape), the formats predicted
    fastest first (here 8-bit products, then 8-bit weights, then fp32 products: SHAPE_CALLS is
    mostly 256-token calls by weight); a probe that runs faster than the baseline has its other
    shapes timed right after it, before the next probe, also when an earlier one ran faster still
    (that one may not hold: timing cannot know); a probe no faster than the baseline waits. A
    deadline then leaves the slow candidates' light shapes untimed, never a fast one's."""
    asked, _ = _probe_order(tmp_path, monkeypatch, fast, None, "all.sqlite")
    cells = list(dict.fromkeys((a[0], a[2]) for a in asked))
    assert cells[:2] == [("bf16", (64, 32)), ("bf16", (32, 64))]
    probes = [c for c in cells[2:] if c[1] == (64, 32)]
    assert [c for c, _ in probes] == ["int8_dyn(act=tensor)", "int8_wo", "fp32_compute"]
    order = [c for c, _ in probes]
    for name in order:
        after = cells.index((name, (64, 32))) + 1
        if name in fast:  # its light shape next
            assert cells[after] == (name, (32, 64))
        else:  # the next probe next, or (the last) the fast ones' cells are all done
            nxt = order[order.index(name) + 1:]
            assert cells[after] == ((nxt[0], (64, 32)) if nxt else [c for c in cells if c not in cells[:after]][0])
            assert cells.index((name, (32, 64))) > max(cells.index((f, (32, 64))) for f in fast)
    # a deadline just past the last fast candidate's light shape: every fast one on both shapes, a
    # slow one on its probe at most
    done = max(i for i, a in enumerate(asked) if (a[0], a[2]) in {(f, (32, 64)) for f in fast})
    _, table = _probe_order(tmp_path, monkeypatch, fast, 0.2 * (done + 1) - 0.1, "cut.sqlite")
    for f in fast:
        assert table.get(f, 1, 32, 64).ok and table.get(f, 1, 64, 32).ok
    slow = next(c for c in ("int8_wo", "fp32_compute") if c not in fast)
    assert table.get(slow, 1, 64, 32).error == timing.NOT_TIMED


@pytest.mark.parametrize("m, first", [(1, "int4_wo(group_size=128)"), (2048, "int8_dyn")])
def test_the_formats_predicted_fastest_on_the_workload_are_probed_first(tmp_path, monkeypatch, m, first):
    """Few-token calls read weights: the fewest stored bits first (int4 before the 8-bit formats);
    many-token calls multiply: the fastest products first (int8 x int8 before weight-only formats)."""
    clock_, asked = _fake_cells(monkeypatch, {True: 0.1, False: 0.6})
    cands = [search_space.get(c) for c in ("bf16", "int8_wo", "int4_wo(group_size=128)", "int8_dyn")]
    measure_latencies([(256, 256)], [m], cands, cache=TimingCache(tmp_path / "t.sqlite"), progress=False,
                      calls={(256, 256): {m: 4}})
    order = list(dict.fromkeys(a[0] for a in asked))
    assert order[0] == "bf16" and order[1] == first
    assert order.index("int8_wo") > order.index("int4_wo(group_size=128)" if m == 1 else "int8_dyn")


@pytest.mark.parametrize("sqnr, first", [(9.0, "int8_dyn"), (40.0, "sparse24_int8_dyn")])
def test_a_format_whose_layer_error_is_far_off_is_probed_after_the_others(tmp_path, monkeypatch, sqnr, first):
    """At 2048 tokens 2:4 int8 computes fastest by the roofline, and is probed first where its layer
    error is small (weights already 2:4); where it is far off (pruning a dense layer: ~9 dB), after
    every other format, so a short deadline times the formats that can hold first."""
    clock_, asked = _fake_cells(monkeypatch, {True: 0.1, False: 0.6})
    cands = [search_space.get(c) for c in ("bf16", "int8_wo", "int8_dyn", "sparse24_int8_dyn")]
    errors = {"int8_wo": 41.0, "int8_dyn": 39.0, "sparse24_int8_dyn": sqnr}
    measure_latencies([(256, 256)], [2048], cands, cache=TimingCache(tmp_path / "t.sqlite"), progress=False,
                      calls={(256, 256): {2048: 4}}, errors=errors)
    probed = list(dict.fromkeys(a[0] for a in asked))
    assert probed[:2] == ["bf16", first]
    assert (probed.index("sparse24_int8_dyn") > probed.index("int8_wo")) == (sqnr < order.PRIOR_FLOOR_DB)


def test_the_order_prior_is_each_candidates_error_on_the_heaviest_layer_kept_for_the_error_stage(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16)).to(torch.bfloat16)
    work = build_inputs(model, [torch.randn(8, 32, dtype=torch.bfloat16)], confirm=False)
    cands = [search_space.get(c) for c in ("bf16", "int8_wo", "int4_wo(group_size=32)")]
    cache = ResultCache(tmp_path / "r.sqlite")
    errors = probe_errors(model, work, cands, cache, None)  # layer 0: 64 x 32 weighs more than 16 x 64
    assert errors["int8_wo"] > errors["int4_wo(group_size=32)"] > 0 and errors["bf16"] == math.inf
    cached = layer_errors(model, work.prof, cands, cache=cache, progress=False, deadline=0.0)  # cache only
    assert cached["0"] == errors and cached["2"] == {}


def test_a_short_deadline_times_every_cell_coarsely_before_refining_any(tmp_path, monkeypatch):
    clock_, asked = _fake_cells(monkeypatch, {True: 0.1, False: 0.6})
    every = {(c.name, kern, shape) for shape in [(64, 32), (32, 64)] for c in CELLS
             for kern in timing.kernel_names(c, torch.device("cpu"))}
    every |= {(c.name, kern, (128, 32)) for c in FUSED for kern in timing.kernel_names(c, torch.device("cpu"))}
    # time for the coarse pass (2 M x 0.1 s per kernel) and a few refinements, not all
    deadline = 0.2 * len(every) + 5.0
    table = measure_latencies([(64, 32), (32, 64)], [1, 256], CELLS, cache=TimingCache(tmp_path / "t.sqlite"),
                              progress=False, calls=SHAPE_CALLS, deadline=deadline, extra=([(128, 32)], FUSED))
    first_refined = next(i for i, a in enumerate(asked) if not a[3])
    assert {a[:3] for a in asked[:first_refined]} == every and len(asked[:first_refined]) == len(every)
    assert all(t.error is None for t in (r.timing for r in table.rows))  # nothing left NOT_TIMED
    # the baseline on every shape first, then the shapes by weight in the workload: the fused shape
    # between the layer shapes, not after them
    order = list(dict.fromkeys((a[0], a[2]) for a in asked[:first_refined]))
    assert order[:2] == [("bf16", (64, 32)), ("bf16", (32, 64))]
    shapes = list(dict.fromkeys(shape for name, shape in order[2:]))
    assert shapes == [(64, 32), (128, 32), (32, 64)]
    # refinements go in the same order, each cell's kernels together, while the deadline allows
    refined = list(dict.fromkeys((a[0], a[2]) for a in asked[first_refined:]))
    assert refined == order[:len(refined)] and 0 < len(refined) < len(order)
    assert clock_.now <= deadline
    for name, shape in order:
        t = table.get(name, 1, shape[1], shape[0])
        assert t.coarse == ((name, shape) not in refined) and t.median_us == (15.0 if t.coarse else 10.0)
    stored = TimingCache(tmp_path / "t.sqlite")
    key = _key_for(table, "bf16", 256, 32, 64)
    assert stored.get(key).median_us == 2560.0 and not stored.get(key).coarse  # refined, in place


def test_a_cached_coarse_cell_is_reused_without_time_and_refined_with_it(tmp_path, monkeypatch):
    clock_, asked = _fake_cells(monkeypatch, {True: 0.1, False: 0.6})
    path = tmp_path / "t.sqlite"

    def measure(deadline):
        asked.clear()
        return measure_latencies([(64, 32)], [1, 256], CELLS, cache=TimingCache(path), progress=False,
                                 deadline=deadline)

    coarse = measure(deadline=0.1)  # time for the baseline only (always timed)
    n_cells = len(coarse.rows)
    assert sum(r.timing.error == timing.NOT_TIMED for r in coarse.rows) == n_cells - 2
    measure(deadline=clock_.now + 8.0)  # the rest, coarsely, and no time to refine them all
    assert any(not a[3] for a in asked) and any(a[3] for a in asked)
    again = measure(deadline=clock_.now)  # no time at all: the cache's cells, coarse or not
    assert again.measured == 0 and all(r.cached for r in again.rows) and any(r.timing.coarse for r in again.rows)
    left = sum(r.timing.coarse for r in again.rows)
    refined = measure(deadline=clock_.now + 100.0)  # time to spare: every coarse cell is timed again
    assert refined.measured >= left > 0 and asked and not any(a[3] for a in asked)
    assert not any(r.timing.coarse for r in refined.rows) and all(r.timing.ok for r in refined.rows)
    assert measure(deadline=None).measured == 0  # and kept


def test_without_a_deadline_cached_coarse_cells_are_timed_again_at_full_precision(tmp_path, monkeypatch):
    _, asked = _fake_cells(monkeypatch, {True: 0.1, False: 0.6})
    path = tmp_path / "t.sqlite"
    coarse = measure_latencies([(64, 32)], [1], CELLS, cache=TimingCache(path), progress=False, deadline=0.0)
    assert coarse.measured == 1 and coarse.get("bf16", 1, 32, 64).coarse  # past the deadline: only the baseline
    asked.clear()
    full = measure_latencies([(64, 32)], [1], CELLS, cache=TimingCache(path), progress=False)
    assert asked and not any(a[3] for a in asked)  # `autoao kernels` and benchmarks: every cell at CELL_SECONDS
    assert all(r.timing.ok and not r.timing.coarse for r in full.rows)


def test_an_old_cache_file_without_the_coarse_column_still_reads(tmp_path):
    import sqlite3

    path = tmp_path / "t.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE timings (key TEXT PRIMARY KEY, spec TEXT NOT NULL, median_us REAL, p20_us REAL, "
                 "p80_us REAL, reps INTEGER, emulated TEXT, error TEXT, created REAL NOT NULL, discarded INTEGER "
                 "NOT NULL DEFAULT 0, reliable INTEGER NOT NULL DEFAULT 1, single_us REAL, threads INTEGER NOT NULL "
                 "DEFAULT 0)")
    conn.execute("INSERT INTO timings (key, spec, median_us, p20_us, p80_us, reps, created) VALUES (?, '{}', 5, 4, 6, "
                 "10, 0)", (key(1).digest(),))
    conn.commit()
    conn.close()
    t = TimingCache(path).get(key(1))
    assert t.median_us == 5.0 and not t.coarse


def test_a_coarse_cpu_timing_is_marked_and_a_cut_one_is_final():
    lin = torch.nn.Linear(64, 32, bias=False).to(torch.bfloat16)
    cpu = torch.device("cpu")
    assert timing.time_module(lin, 1, 64, torch.bfloat16, cpu, max_seconds=timing.COARSE_SECONDS).coarse
    assert not timing.time_module(lin, 1, 64, torch.bfloat16, cpu, max_seconds=timing.CELL_SECONDS).coarse
    # far behind the baseline: one clean sample decides it, as a refinement's would
    cut = timing.time_module(lin, 1, 64, torch.bfloat16, cpu, max_seconds=timing.COARSE_SECONDS, stop_above_us=0.001)
    assert cut.ok and not cut.coarse


##### the lost-CPU detector judges a sample on its own window ####################################

def test_a_sample_is_judged_on_the_run_queue_delay_of_its_own_window(monkeypatch):
    """Run-queue delay that accrues while the cgroup's throttling is read (before the sample starts,
    after it ends) is not the sample's: only the delay between its two schedstat reads counts."""
    lost = [0]

    def throttled():  # each read of the cgroup's file is where the process waits for a CPU
        lost[0] += 10**9
        return 0

    monkeypatch.setattr(clock, "throttled_ns", throttled)
    monkeypatch.setattr(clock, "cpu_lost_ns", lambda: lost[0])
    s = clock.time_cpu(lambda: None, reps=5, warmup=0)
    assert s.reliable and s.discarded == 0 and s.reps == 5


def test_the_clock_keeps_each_threads_schedstat_open(monkeypatch):
    """Reading the process's run-queue delay opens each thread's schedstat once, not per sample:
    opened anew before and after every sample, the reads outlasted a small layer's call and widened
    the window each sample was judged on."""
    import builtins
    import os

    opened = []
    real_open, real_os_open = builtins.open, os.open
    monkeypatch.setattr(builtins, "open", lambda f, *a, **k: opened.append(str(f)) or real_open(f, *a, **k))
    monkeypatch.setattr(os, "open", lambda f, *a, **k: opened.append(str(f)) or real_os_open(f, *a, **k))
    threads = len(os.listdir("/proc/self/task"))
    s = clock.time_cpu(lambda: None, reps=200, warmup=0, max_seconds=0.01)
    assert s.reps + s.discarded >= 100
    assert 0 < clock.cpu_lost_ns()
    assert sum("schedstat" in f for f in opened) <= threads
