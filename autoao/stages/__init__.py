"""The run's stages, in the order a run takes them (ARCHITECTURE.md draws them):

    inputs     profile + calibration + held-out inputs              -> Inputs
    measure    kernel timing table, layer errors, baselines          -> Measurements
    judges     the accuracy judges, their references and prices      -> Judges
    search     Optuna trials on the cost model and the screen        -> SearchOutcome
    bench      a plan applied, measured and scored end to end
    anchors    a uniform plan's measured speed-up scales its cells
    choose     every judge's verdict on one plan                     -> Judged
    anytime    verify the most valuable plan or search more, until the time is spent
    finalize   the final interleaved comparison                      -> RunSummary
    outputs    the run files and the report

Each stage takes the previous stages' typed results; none imports a later one.
"""
