"""structlog JSON logging with Temporal context and secret redaction.

Why: operators read worker logs next to the Temporal UI; every line carries the workflow/activity it
belongs to (PostHog's ``merge_temporal_context`` pattern) and passes through ``domain.redact`` so a
secret that slipped into a message never reaches the log sink.
"""

from __future__ import annotations

import logging
import sys

import structlog

from domain.redact import redact, redact_obj


def _merge_temporal_context(_logger, _name, event_dict):
    try:
        from temporalio import activity, workflow
    except ImportError:  # pragma: no cover
        return event_dict
    try:
        info = activity.info()
        event_dict.setdefault("workflow_id", info.workflow_id)
        event_dict.setdefault("activity_type", info.activity_type)
        event_dict.setdefault("attempt", info.attempt)
        return event_dict
    except RuntimeError:
        pass
    try:
        winfo = workflow.info()
        event_dict.setdefault("workflow_id", winfo.workflow_id)
        event_dict.setdefault("workflow_type", winfo.workflow_type)
    except Exception:  # not in a workflow
        pass
    return event_dict


def _redact(_logger, _name, event_dict):
    return {k: (redact(v) if isinstance(v, str) else redact_obj(v)) for k, v in event_dict.items()}


def configure_logging(level: str = "INFO", *, json: bool = True, stream=None) -> None:
    """structlog for our own loggers and the SDK's stdlib loggers alike: one JSON line per event,
    with workflow/activity context, and every string passed through the redactor."""
    stream = stream or sys.stderr
    shared = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _merge_temporal_context,
    ]
    renderer = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, _redact, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )
    # The SDK's and the activities' stdlib loggers (activity.logger, workflow.logger) share the format;
    # their ``temporal_activity`` / ``temporal_workflow`` extras become fields.
    handler = logging.StreamHandler(stream)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, structlog.stdlib.ExtraAdder(), _flatten_temporal_extras],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info, _redact, renderer]))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    # One line per state change, not per HTTP call: httpx logs every request at INFO (a poll loop is
    # a wall of them). Their failures still surface as our errors; DEBUG brings the requests back.
    quiet = logging.DEBUG if logging.getLevelName(level) == logging.DEBUG else logging.WARNING
    for name in ("httpx", "httpcore", "git.cmd"):
        logging.getLogger(name).setLevel(quiet)


def _flatten_temporal_extras(_logger, _name, event_dict):
    for key in ("temporal_activity", "temporal_workflow"):
        info = event_dict.pop(key, None)
        if isinstance(info, dict):
            for k in ("workflow_id", "activity_type", "workflow_type", "attempt", "run_id"):
                if k in info:
                    event_dict.setdefault(k, info[k])
    return event_dict


def get_logger(name: str = "gpu_rl_builder"):
    return structlog.get_logger(name)
