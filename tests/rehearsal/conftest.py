"""Every rehearsal test runs in the stand-in task image (the session's ``task_images``)."""

import pytest

from tests.rehearsal import helpers


@pytest.fixture(autouse=True)
def _rehearsal_images(task_images):
    helpers.IMAGES = task_images
    yield
