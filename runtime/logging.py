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
        event_dict.setdefault("activity", info.activity_type)
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


def configure_logging(level: str = "INFO", *, json: bool = True) -> None:
    processors = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _merge_temporal_context,
        structlog.processors.format_exc_info,
        _redact,
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False),
    ]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    # The SDK's own stdlib loggers go through the same redaction.
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_RedactFilter())
    logging.basicConfig(level=level, handlers=[handler], force=True)


class _RedactFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = redact(record.getMessage())
        record.args = None
        return True


def get_logger(name: str = "gpu_rl_builder"):
    return structlog.get_logger(name)
