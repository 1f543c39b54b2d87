"""Every pinned image and tool records its upstream end of life beside the pin, and the suite fails once
a recorded date has passed (or when a pin has no record). Records are comments of the form

    end-of-life <name>:<tag>|<package>=<version>|<tool>==<version> YYYY-MM-DD (source)
    end-of-life <pin> none (why upstream gives no date)

in the same file as the pin: docker/Dockerfile (base image, apt packages), docker/install.py (kubectl),
docker/tools.txt (pip tools), docker/iris-protos.txt (marin-iris's message classes) and deploy/temporal/compose.yaml (the team server's images).
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import re
from pathlib import Path

import pytest
import yaml

from tests.deploy.wheel_venv import DOCKERFILE, ROOT, dockerfile_stages

COMPOSE = ROOT / "deploy" / "temporal" / "compose.yaml"
INSTALL = ROOT / "docker" / "install.py"
TOOLS = ROOT / "docker" / "tools.txt"
IRIS_PROTOS = ROOT / "docker" / "iris-protos.txt"
RECORD = re.compile(r"end-of-life (?P<pin>\S+) (?P<date>\d{4}-\d{2}-\d{2}|none)\b(?P<why>[^\n]*)")


def records(text: str) -> dict[str, str]:
    """pin -> ISO date or "none" (a "none" record must say why)."""
    out = {}
    for m in RECORD.finditer(text):
        assert m["date"] != "none" or len(m["why"].strip()) > 10, f"{m['pin']}: 'none' needs a reason"
        out[m["pin"]] = m["date"]
    return out


def expired(recorded: dict[str, str], today: dt.date) -> list[str]:
    return [f"{pin} (end of life {date})" for pin, date in sorted(recorded.items())
            if date != "none" and dt.date.fromisoformat(date) <= today]


def _install():
    spec = importlib.util.spec_from_file_location("docker_install_eol", INSTALL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pins() -> dict[Path, list[str]]:
    """Every pin, by the file that holds it."""
    out: dict[Path, list[str]] = {}
    for stage in dockerfile_stages():
        ref = stage[0].value[0].split("@", 1)[0]
        out.setdefault(DOCKERFILE, []).append(ref)
        for c in stage:
            if c.cmd == "RUN" and "apt-get install" in c.value[0]:
                out[DOCKERFILE] += [p.strip("'\"") for p in re.findall(r"[\"']?[\w.+-]+=[^\s\"']+[\"']?", c.value[0])]
    out[INSTALL] = [f"kubectl:{_install().KUBECTL_VERSION}"]
    out[TOOLS] = re.findall(r"^([\w-]+==[\w.]+)", TOOLS.read_text(), re.M)
    out[IRIS_PROTOS] = re.findall(r"^([\w-]+==[\w.]+)", IRIS_PROTOS.read_text(), re.M)
    for service in yaml.safe_load(COMPOSE.read_text())["services"].values():
        image = re.sub(r"\$\{\w+:-([^}]+)\}", r"\1", service["image"])
        if not image.startswith("gpu-rl-builder:"):  # built from this repository
            out.setdefault(COMPOSE, []).append(image)
    return {path: sorted(set(p)) for path, p in out.items()}


def test_every_pin_records_its_end_of_life_beside_it():
    found = pins()
    assert {"python:3.12-slim-bookworm", "git=1:2.39.*"} <= set(found[DOCKERFILE])
    assert len(found[COMPOSE]) == 4 and len(found[TOOLS]) == 2 and len(found[IRIS_PROTOS]) == 2
    for path, pinned in found.items():
        recorded = records(path.read_text())
        missing = [p for p in pinned if p not in recorded]
        assert not missing, f"{path.relative_to(ROOT)}: no end-of-life record for {missing}"
    assert records(INSTALL.read_text())[f"kubectl:{_install().KUBECTL_VERSION}"] == _install().KUBECTL_EOL


def test_no_pinned_image_or_tool_is_past_its_end_of_life():
    today = dt.date.today()
    past = [f"{path.relative_to(ROOT)}: {e}" for path in pins() for e in expired(records(path.read_text()), today)]
    assert not past, "past upstream end of life, bump: " + "; ".join(past)


def test_a_past_date_or_an_unexplained_none_is_caught():
    text = "# end-of-life kubectl:v1.31.14 2025-10-28 (https://kubernetes.io/releases/1.31/)\n"
    assert expired(records(text), dt.date(2026, 12, 2)) == ["kubectl:v1.31.14 (end of life 2025-10-28)"]
    assert expired(records(text), dt.date(2025, 10, 27)) == []
    with pytest.raises(AssertionError, match="needs a reason"):
        records("# end-of-life foo:1 none\n")
