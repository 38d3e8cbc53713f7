"""The tests need a live daemon: BRIG_URL and BRIG_API_KEY (tests/sdk_python.rs
starts one and runs these as root)."""

import os

import pytest


def pytest_collection_modifyitems(config, items):
    if os.environ.get("BRIG_URL") and os.environ.get("BRIG_API_KEY"):
        return
    skip = pytest.mark.skip(reason="no daemon: set BRIG_URL and BRIG_API_KEY")
    for item in items:
        item.add_marker(skip)
