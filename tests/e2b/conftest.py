"""Fixtures of the E2B SDK tests (run by tests/e2b_sdk.rs against a live daemon).

The SDK finds the daemon through its own variables: E2B_API_URL and E2B_SANDBOX_URL
(both the daemon's address), E2B_API_KEY (a brig key of tenant `e2b`). A second
tenant's key is in BRIG_E2B_OTHER_KEY. Tests may run in parallel (pytest-xdist):
each makes its own sandboxes, finds them by labels of its own, and kills them.
"""

import os
import uuid

import pytest
from e2b import Sandbox

# Generous: CI is a loaded 2-core VM.
TIMEOUT = 300


@pytest.fixture
def api_key() -> str:
    return os.environ["E2B_API_KEY"]


@pytest.fixture
def other_api_key() -> str:
    """A key of another tenant."""
    return os.environ["BRIG_E2B_OTHER_KEY"]


@pytest.fixture
def label() -> str:
    """A metadata value of this test's own, to find its sandboxes by."""
    return uuid.uuid4().hex


@pytest.fixture
def sandboxes(label):
    """Makes sandboxes labelled `suite=<label>`; kills them all after the test."""
    made = []

    def make(**kwargs) -> Sandbox:
        metadata = {"suite": label, **kwargs.pop("metadata", {})}
        kwargs.setdefault("timeout", TIMEOUT)
        sandbox = Sandbox.create(metadata=metadata, **kwargs)
        made.append(sandbox.sandbox_id)
        return sandbox

    yield make
    for sandbox_id in made:
        Sandbox.kill(sandbox_id)


@pytest.fixture
def sandbox(sandboxes) -> Sandbox:
    """One sandbox of the `base` template, killed after the test."""
    return sandboxes()
