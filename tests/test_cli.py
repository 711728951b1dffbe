"""`autoao search` and `autoao apply` end to end on a tiny model; bad input exits 2 with one line."""

from __future__ import annotations

import json
import time
from pathlib import Path

import optuna
import pytest

from autoao.cli import main

TINY = str(Path(__file__).with_name("tiny_models.py")) + ":build"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOAO_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.parametrize("argv, message", [
    (["search", "--candidates", "int3"], "Unknown candidate 'int3'"),
    (["search", "--budget", "5 parsecs"], "bad --budget"),
    (["search", "--max-accuracy-drop", "1.5"], "must be between 0 and 1"),
    (["search", "--max-accuracy-drop=-2%"], "must be between 0 and 1"),
    (["search", "--model", "no_such_module_xyz:build"], "cannot import no_such_module_xyz"),
    (["search", "--model", "missing_file.py:build"], "does not exist"),
    (["search", "--model", TINY.replace(":build", ":broken")], "broken() failed"),
    (["search", "--model", "smollm3"], "unknown --model 'smollm3'"),
    (["search", "--model", "minilm-l7"], "unknown --model 'minilm-l7' (did you mean minilm-l6?)"),
    (["apply", "--model", TINY, "--plan", "nope.json", "--save", "x"], "does not exist"),
    (["search", "--tasks", "autoao_fact"], "did you mean: autoao_facts?"),
    (["search", "--storage", "postgresql://nobody@127.0.0.1:9/none"], "--storage: storage"),
    (["search", "--storage", "not a url"], "is not a database URL"),
    (["search", "--storage", "sqlite:////no/such/folder/x.db"], "does not exist"),
    (["search", "--device", "tpu"], "--device"),
    (["search", "--candidates", ""], "candidates is empty"),
    (["cache", "frobnicate"], "invalid choice"),
])
def test_bad_input_one_line_exit_2(argv, message, capsys, tmp_path):
    """Each bad argument: one line naming it, exit 2, within seconds (nothing loaded or measured)."""
    start = time.perf_counter()
    try:
        rc = main([*argv, "--out", str(tmp_path / "o")] if argv[0] == "search" else argv)
    except SystemExit as e:  # argparse's own errors (a bad choice)
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2, err
    assert message in err and err.rstrip("\n").splitlines()[-1].startswith(("autoao: error:", "autoao cache: error:")), err
    assert "Traceback" not in err and time.perf_counter() - start < 10
    if argv[0] != "cache":
        assert err.count("\n") == 1, err


def test_out_dir_that_cannot_be_written_is_one_line(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["search", "--out", str(blocker / "sub")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("autoao: error: --out: output directory") and err.count("\n") == 1, err


def test_cache_info_and_clear(tmp_path, capsys):
    from autoao import search_space
    from autoao.evaluators.cache import TimingCache
    from autoao.evaluators.timing import measure_latencies

    cache_dir = tmp_path / "c"
    measure_latencies([(32, 64)], [1], [search_space.get("bf16")], cache=TimingCache(cache_dir / "timings.sqlite"),
                      progress=False)
    assert main(["cache", "info", "--cache-dir", str(cache_dir)]) == 0
    out = capsys.readouterr().out
    assert "1 cached timings" in out and "1 cells" in out
    assert main(["cache", "clear", "--device", "no-such-device", "--cache-dir", str(cache_dir)]) == 0
    assert "cleared 0" in capsys.readouterr().out
    assert main(["cache", "clear", "--cache-dir", str(cache_dir)]) == 0
    assert "cleared 1 cached timings" in capsys.readouterr().out
    assert len(TimingCache(cache_dir / "timings.sqlite")) == 0


def test_search_writes_everything_and_continues_the_study(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["search", "--model", TINY, "--budget", "12", "--tasks", "none", "--out", str(out), "--quiet",
            "--max-accuracy-drop", "5%"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "plan:" in text and "latency:" in text
    for name in ("plan.json", "pareto.json", "summary.json", "context.json", "study.db", "best_plan.json",
                 "model/plan.json", "model/model.safetensors"):
        assert (out / name).exists(), name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["accuracy"] is None or summary["accuracy"]["drop"] <= 0.05
    study = optuna.load_study(study_name=summary["study_name"], storage=summary["storage"])
    first = len([t for t in study.trials if t.state.is_finished()])
    assert first == 12
    # same output directory again: the study continues (budget counts all trials of the study)
    assert main([*argv[:4], "20", *argv[5:], "--resume"]) == 0
    study = optuna.load_study(study_name=summary["study_name"], storage=summary["storage"])
    assert len([t for t in study.trials if t.state.is_finished()]) == 20
    # apply the plan to a fresh copy and save it
    saved = tmp_path / "applied"
    assert main(["apply", "--model", TINY, "--plan", str(out / "plan.json"), "--save", str(saved)]) == 0
    assert (saved / "model.safetensors").is_file()


def test_search_for_a_target_takes_the_targets_own_space(tmp_path, capsys):
    # no --candidates: the target's search space (GGUF types for llama.cpp), not autoao's default one
    out = tmp_path / "run"
    assert main(["search", "--model", TINY, "--target", "llama.cpp", "--budget", "4", "--tasks", "none",
                 "--out", str(out), "--quiet"]) == 0
    names = {c["name"] for c in json.loads((out / "context.json").read_text())["candidates"]}
    assert {"gguf(type=q8_0)", "gguf(type=q4_0)"} <= names and "int8_wo" not in names


@pytest.mark.parametrize("n, message", [(-1, "bad --generate -1"), (4, "needs a causal LM with .generate()")])
def test_generate_that_cannot_run_is_one_line_exit_2(tmp_path, capsys, n, message):
    assert main(["search", "--model", TINY, "--generate", str(n), "--budget", "4", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_a_factory_workload_that_is_not_callable_is_one_line_exit_2(tmp_path, capsys):
    spec = TINY.replace(":build", ":with_bad_workload")
    assert main(["search", "--model", spec, "--budget", "4", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "'workload' must be a callable(model)" in err and err.count("\n") == 1, err


def test_resume_without_a_study_is_an_error(tmp_path, capsys):
    rc = main(["search", "--model", TINY, "--resume", "--out", str(tmp_path / "empty"), "--quiet"])
    assert rc == 2 and "no study to continue" in capsys.readouterr().err


def test_a_factorys_inputs_follow_the_model_to_the_device():
    # --device moves the model; the factory's example/eval inputs (made on the CPU: it cannot know
    # the device) must go with it, or the first forward fails on a GPU machine ("meta" stands in here)
    import torch

    from autoao.cli.args import load_model

    loaded = load_model(TINY, torch.device("meta"))
    assert next(loaded["model"].parameters()).device.type == "meta"
    inputs = loaded["example_inputs"] + loaded["eval_inputs"]
    assert inputs and all(t.device.type == "meta" for t in inputs)


def test_the_demo_leaves_out_what_its_weights_misrepresent(capsys):
    """smollm2-135m's weights were a GGUF Q4_1 grid: int4 group 32 is left out unless named, and
    forcing it warns."""
    from autoao import search_space
    from autoao.cli.search import provenance_filter

    every = search_space.all_candidates()
    kept, left_out = provenance_filter("smollm2-135m", every, by_default=True)
    # group 32 by any algorithm re-quantizes the grid: every group-32 candidate goes
    every = every + [search_space.get("int4_wo(group_size=32, algorithm=gptq)")]
    kept, left_out = provenance_filter("smollm2-135m", every, by_default=True)
    assert not any("group_size=32" in c.name for c in kept) and len(kept) == len(every) - 2
    assert set(left_out) == {"int4_wo(group_size=32)", "int4_wo(group_size=32, algorithm=gptq)"}
    assert "Q4_1" in left_out["int4_wo(group_size=32)"]
    assert "leaving out int4_wo(group_size=32)" in capsys.readouterr().err
    forced = [search_space.get("int4_wo(group_size=32)")]
    assert provenance_filter("smollm2-135m", forced, by_default=False) == (forced, {})
    assert "warning: int4_wo(group_size=32) is forced" in capsys.readouterr().err
    assert provenance_filter("my.py:build", every, by_default=True) == (every, {})  # not a built-in model


def test_a_built_in_models_one_off_conversion_is_announced_once(tmp_path, monkeypatch, capsys):
    """The first load of smollm2-135m converts its GGUF file (most of a first run's start): the CLI
    says so before it starts; once converted, and for the encoder, it says nothing."""
    from autoao import models
    from autoao.cli.args import load_model

    monkeypatch.setenv("AUTOAO_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(models, "load_spec", lambda spec, device: {"name": spec})  # no conversion here
    load_model("smollm2-135m", "cpu")
    assert "converting smollm2-135m from its GGUF file, once" in capsys.readouterr().err
    converted = tmp_path / "models" / "smollm2-135m" / "bfloat16"
    converted.mkdir(parents=True)
    (converted / "config.json").write_text("{}")
    load_model("smollm2-135m", "cpu")
    load_model("minilm-l6", "cpu")
    assert capsys.readouterr().err == ""
