"""brig's shim for onyx's code-interpreter tests (vendored beside it, see
tests/onyx/LICENSE): they run against a live `brig serve` instead of onyx's own
server.

- The integration tests build onyx's app in process (`app.main.create_app`) and call
  it through FastAPI's `TestClient`; `shim/` stands in for both, so the same calls
  go over HTTP to the daemon at `BRIG_URL`.
- The end-to-end tests talk to `BASE_URL` (onyx's `http://localhost:8000`), which
  each module's fixture points at `BRIG_URL`.

tests/onyx.rs starts the daemon (`--no-auth` on loopback: onyx's clients send no
key) and runs pytest here with `BRIG_URL` set.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "shim"))


@pytest.fixture(autouse=True)
def _brig_base_url(request: pytest.FixtureRequest) -> Iterator[None]:
    module = request.module
    if hasattr(module, "BASE_URL"):
        module.BASE_URL = os.environ["BRIG_URL"]
    yield
