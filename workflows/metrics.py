"""Domain metrics beside the SDK's own: stages entered, failures by class, time waiting on an operator.

Why the workflow metric meter: it is replay-safe (nothing is recorded while a worker replays history),
the SDK tags every point with namespace, task queue and workflow type, and the points leave through the
same Prometheus endpoint as the SDK's metrics (`worker.py --metrics HOST:PORT`), so a dashboard needs
no second exporter. Current counts per stage are a visibility query (`BuildStage = '…'`); these are
the rates and durations a query cannot give.
"""

from __future__ import annotations

from temporalio import workflow

STAGE_ENTERED = "gpu_rl_builder_stage_entered"
FAILURES = "gpu_rl_builder_failures"
OPERATOR_WAIT = "gpu_rl_builder_operator_wait"


def stage_entered(kind: str, stage: str, *, failure_class: str | None = None) -> None:
    """Count one entry into ``stage`` (``kind`` is ``pipeline`` or ``target``); ``failure_class`` is
    given once, when a target ends failed, so each failed target counts once under its class."""
    meter = workflow.metric_meter()
    meter.create_counter(STAGE_ENTERED, "Stages entered by build pipelines and targets").add(
        1, {"workflow": kind, "stage": stage})
    if failure_class:
        meter.create_counter(FAILURES, "Targets that ended failed, by failure class").add(
            1, {"workflow": kind, "failure_class": failure_class})


def operator_wait(kind: str, reason: str, seconds: float) -> None:
    """Record how long a build waited on a person (a decision, package visibility, merge approval)."""
    workflow.metric_meter().create_histogram_float(
        OPERATOR_WAIT, "Time a build waited on an operator", "s").record(
        max(0.0, seconds), {"workflow": kind, "reason": reason})
