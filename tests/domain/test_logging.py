import dataclasses
import io
import json
import logging

from temporalio import activity
from temporalio.testing import ActivityEnvironment

from domain.redact import register_secret
from runtime.logging import configure_logging, get_logger


async def test_activity_logs_are_json_with_context_and_redacted():
    out = io.StringIO()
    configure_logging("INFO", stream=out)
    register_secret("sentinel-SECRET-4711")

    @activity.defn(name="demo_activity")
    async def demo() -> None:
        activity.logger.info("pushing with token sentinel-SECRET-4711")
        get_logger("test").info("structlog line", token="sentinel-SECRET-4711")

    try:
        env = ActivityEnvironment()
        env.info = dataclasses.replace(env.info, activity_type="demo_activity", workflow_id="wf-1")
        await env.run(demo)
    finally:
        logging.basicConfig(force=True, handlers=[logging.NullHandler()])
    lines = [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]
    assert len(lines) == 2
    for rec in lines:
        assert rec["activity_type"] == "demo_activity" and rec["workflow_id"] == "wf-1" and "sentinel-SECRET-4711" not in json.dumps(rec)
    assert "[REDACTED]" in lines[0]["event"] and lines[1]["token"] == "[REDACTED]"


async def test_http_calls_are_not_logged_at_info_but_come_back_at_debug():
    import httpx

    for level, expected in (("INFO", False), ("DEBUG", True)):
        buf = io.StringIO()
        configure_logging(level, stream=buf)
        transport = httpx.MockTransport(lambda request: httpx.Response(200))
        async with httpx.AsyncClient(transport=transport) as http:
            await http.get("https://registry.example/v2/")
        get_logger("t").info("state changed")
        out = buf.getvalue()
        assert ("HTTP Request" in out) is expected, (level, out)
        assert "state changed" in out
    configure_logging("INFO")
