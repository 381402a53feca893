"""Performance model of serving replicas (analytical, calibratable).

Use :func:`scenario_catalog` to get a scenario's GPUs with its calibration file applied, then
:func:`replica_perf` for one replica's memory and timing.
"""

from boute.perf.calibration import (
    Calibration,
    FitResult,
    MeasuredPoint,
    apply_calibration,
    fit_efficiency,
    load_calibration,
    predict_point,
    save_calibration,
    scenario_catalog,
    with_calibration,
)
from boute.perf.model import ReplicaPerf, replica_perf

__all__ = [
    "Calibration",
    "FitResult",
    "MeasuredPoint",
    "ReplicaPerf",
    "apply_calibration",
    "fit_efficiency",
    "load_calibration",
    "predict_point",
    "replica_perf",
    "save_calibration",
    "scenario_catalog",
    "with_calibration",
]
