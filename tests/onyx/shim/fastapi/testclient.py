"""FastAPI's `TestClient` for onyx's vendored tests: an httpx client of the daemon at
`BRIG_URL` (Starlette's TestClient is an httpx client too, so every call the tests
make means the same)."""

from __future__ import annotations

import os
from typing import Any

import httpx


class TestClient(httpx.Client):
    __test__ = False  # not a pytest test class

    def __init__(self, app: Any = None, **kwargs: Any) -> None:
        # In process nothing times out; over HTTP on a loaded machine, allow plenty.
        kwargs.setdefault("timeout", httpx.Timeout(120.0, connect=10.0))
        super().__init__(base_url=os.environ["BRIG_URL"], **kwargs)
