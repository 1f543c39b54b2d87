import pytest

from tests.deploy.wheel_venv import WheelVenv, build_wheel_venv


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory) -> WheelVenv:
    """The worker image's install steps (from docker/Dockerfile) run into a fresh venv, once per session."""
    return build_wheel_venv(tmp_path_factory.mktemp("wheel"))
