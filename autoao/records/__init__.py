"""What a run writes and the report reads: typed, versioned records. A leaf package (it imports only
autoao.common, autoao.types, autoao.decisions and autoao.upgrades), so the writer (the stages) and
the reader (autoao.reports) share these classes and no one indexes raw JSON by string. One module
a kind of file: `context` (context.json), `summary` (summary.json, anytime.json), `trials` (the
study's trial records), `codec` (JSON in and out).

    context.json   RunContext: everything known before the first trial (so an interrupted run can
                   still be reported): model, device, versions, candidates, per-layer timings/SQNR
    summary.json   RunSummary: only when the run finished: measured latencies, the shipped plan's
                   verdicts, the plan, where the time went (planned and spent per stage), and the
                   decisions that led to the plan
    pareto.json    ParetoRow per plan of the front
    anytime.json   AnytimeState: the incumbent (the best plan verified so far, with its verdicts and
                   its measured rounds), the anytime curve and the plans already judged, rewritten
                   after each verification: what the same command continues from
    the study      one TrialRecord per trial, written by the search's objective (`TrialRecord.attrs`)
                   and read back by the search, the workers and the report (`TrialRecord.read`)

Files carry `version` (RUN_FILES_VERSION). `load_context` / `load_summary` read a file written by
this or an earlier autoao (upgraded in memory: autoao.upgrades); a newer or
unreadable file raises RunFileError naming the file and what to do.
"""

from __future__ import annotations

from autoao.records.codec import RunFileError, from_dict, read_json, to_dict, write
from autoao.records.context import (AccuracySpec, AnchorRecord, CandidateRecord, DeviceInfo, FusedRecord,
                                    GroupRecord, KernelTimes, Latency, LayerRecord, ModelInfo, RunContext,
                                    TimingHealth, load_context)
from autoao.records.summary import (AnytimeState, CurvePoint, Deploy, DeployRow, IncumbentRecord, MeasuredPlan,
                                    ParetoRow, RunSummary, StageTime, UniformRow, WeightBytes, WorkloadTiming,
                                    load_summary)
from autoao.records.trials import TrialRecord, pareto_front
from autoao.upgrades import RUN_FILES_VERSION

__all__ = ["AccuracySpec", "AnchorRecord", "AnytimeState", "CandidateRecord", "CurvePoint", "Deploy", "DeployRow",
           "DeviceInfo", "FusedRecord", "GroupRecord", "IncumbentRecord", "KernelTimes", "Latency", "LayerRecord",
           "MeasuredPlan", "ModelInfo", "ParetoRow", "RUN_FILES_VERSION", "RunContext", "RunFileError", "RunSummary",
           "StageTime", "TimingHealth", "TrialRecord", "UniformRow", "WeightBytes", "WorkloadTiming", "from_dict",
           "load_context", "load_summary", "pareto_front", "read_json", "to_dict", "write"]
