"""onyx's `create_app`, for its vendored tests: there is no app in process; the
`TestClient` of the shim talks to brig over HTTP instead."""

from __future__ import annotations


def create_app() -> None:
    return None
