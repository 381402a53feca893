"""Performance model of serving replicas (analytical, calibratable)."""

from boute.perf.model import ReplicaPerf, replica_perf

__all__ = ["ReplicaPerf", "replica_perf"]
