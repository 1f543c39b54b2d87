import pytest

from tests.deploy.wheel_venv import WheelVenv, build_wheel_venv


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory) -> WheelVenv:
    """The worker image's install steps (from docker/Dockerfile) run into a fresh venv, once per session."""
    return build_wheel_venv(tmp_path_factory.mktemp("wheel"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The first test that uses ``wheel_venv`` pays for its pip installs (minutes on a loaded machine):
    those tests get 15 minutes instead of the suite's 5."""
    for item in items:
        if "wheel_venv" in getattr(item, "fixturenames", ()) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(900))
