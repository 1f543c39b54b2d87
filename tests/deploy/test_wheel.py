"""``pip install .`` gives a working service: every package in the wheel, and both entry points run from
an empty directory; the stand-ins (``sandbox``) and the tests ship in neither the wheel nor the image.
(The installed worker against the sandbox Temporal: tests/deploy/test_image.py.)"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from tests.deploy.wheel_venv import ROOT, dockerfile_stages

SERVICE_PACKAGES = ("domain", "clients", "rehearsal", "activities", "workflows", "runtime")


def test_wheel_holds_every_service_package_and_module(wheel_venv):
    names = set(zipfile.ZipFile(wheel_venv.wheel).namelist())
    packages = {str(p.parent.relative_to(ROOT)) for top in SERVICE_PACKAGES for p in (ROOT / top).rglob("__init__.py")
                if "__pycache__" not in p.parts}
    assert "runtime" in packages and "domain/contract" in packages
    missing = sorted(p for p in packages if f"{p}/__init__.py" not in names)
    assert not missing, f"packages left out of the wheel: {missing}"
    modules = {str(p.relative_to(ROOT)) for top in SERVICE_PACKAGES for p in (ROOT / top).rglob("*.py")
               if "__pycache__" not in p.parts}
    assert not sorted(modules - names), f"modules left out of the wheel: {sorted(modules - names)}"
    assert {"worker.py", "starter.py"} <= names
    assert "rehearsal/standins/standin" in names  # production rehearses with it (rehearsal/runner.py)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel_venv.wheel).read(entry_points).decode()
    assert "gpu-rl-builder = starter:main" in text and "gpu-rl-builder-worker = worker:main" in text


@pytest.mark.parametrize("command", ["gpu-rl-builder", "gpu-rl-builder-worker"])
def test_entry_points_help_from_an_empty_directory(wheel_venv, command):
    out = wheel_venv.run(str(wheel_venv.bin / command), "--help")
    assert out.returncode == 0, out.stderr
    for flag in ("--config", "--address", "--namespace", "--profile"):
        assert flag in out.stdout, f"{command} --help lacks {flag}"
    # The installed code runs, not the source folder's.
    where = wheel_venv.run(str(wheel_venv.bin / "python"), "-c", "import runtime, worker; print(runtime.__file__)")
    assert where.returncode == 0 and str(wheel_venv.prefix) in where.stdout, where.stderr


def test_no_sandbox_or_test_code_in_the_wheel_or_the_image(wheel_venv):
    """The stand-ins, their fixtures (the kaniko stand-in) and the tests are test code: never shipped."""
    names = zipfile.ZipFile(wheel_venv.wheel).namelist()
    shipped = sorted(n for n in names if n.split("/", 1)[0] in ("sandbox", "tests"))
    assert not shipped, f"test code in the wheel: {shipped[:5]} ({len(shipped)} files)"
    top_level = next(n for n in names if n.endswith("top_level.txt"))
    assert {"sandbox", "tests"}.isdisjoint(zipfile.ZipFile(wheel_venv.wheel).read(top_level).decode().split())
    copied = [src for stage in dockerfile_stages() for c in stage if c.cmd == "COPY" for src in c.value[:-1]]
    assert "domain" in copied and not [s for s in copied if s.split("/", 1)[0] in ("sandbox", "tests", ".")], copied
    # The installed service does not find the stand-ins; the source tree (scripts, tests) still does.
    gone = wheel_venv.run(str(wheel_venv.bin / "python"), "-c", "import sandbox")
    assert gone.returncode != 0 and "No module named 'sandbox'" in gone.stderr
    import sandbox.github_standin

    assert Path(sandbox.github_standin.__file__).resolve().is_relative_to(ROOT / "sandbox")
