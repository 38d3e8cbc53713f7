"""Errors the daemon answers, one class per family of its stable codes.

Every error carries the daemon's own ``code`` (e.g. ``no_such_file``), the HTTP
``status`` and the one-line ``message``; catch a family, or look at ``code``.
"""

from __future__ import annotations

import builtins
import json
from typing import Dict, Optional, Type


class BrigError(Exception):
    """An error answered by the daemon (or met talking to it)."""

    def __init__(self, message: str, code: str = "error", status: Optional[int] = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status

    def __str__(self) -> str:
        where = f"{self.status} " if self.status else ""
        return f"{where}{self.code}: {self.message}"


class AuthenticationError(BrigError):
    """``unauthorized`` (no or unknown key) and ``forbidden``."""


class NotFoundError(BrigError):
    """``not_found`` (an unknown or gone id) and ``no_such_file``."""


class InvalidRequestError(BrigError):
    """``bad_request``, ``invalid_request``, ``payload_too_large`` and other refused input."""


class ConflictError(BrigError):
    """``conflict`` and ``busy``: the state of the session does not allow it now."""


class FilesystemError(BrigError):
    """A file operation refused inside a session: ``path_escapes``,
    ``permission_denied``, ``read_only``, ``not_a_file``, ``not_a_directory``,
    ``already_exists``, ``not_empty``, ``invalid_path``, ``invalid_archive``."""


class CapacityError(BrigError):
    """A limit reached: ``quota_exceeded``, ``unavailable``, ``no_space``, ``memory_full``."""


class TimeoutError(BrigError, builtins.TimeoutError):
    """``request_timeout`` (a request's body stalled), or a wait that ran out; also a
    builtin ``TimeoutError``, so ``except TimeoutError`` catches it either way."""


class InternalError(BrigError):
    """``internal``: a bug or a host failure on the daemon's side."""


_FAMILIES: Dict[str, Type[BrigError]] = {}
for _cls, _codes in {
    AuthenticationError: ["unauthorized", "forbidden"],
    NotFoundError: ["not_found", "no_such_file"],
    InvalidRequestError: [
        "bad_request",
        "invalid_request",
        "payload_too_large",
        "uri_too_long",
        "headers_too_large",
    ],
    ConflictError: ["conflict", "busy"],
    FilesystemError: [
        "path_escapes",
        "permission_denied",
        "read_only",
        "not_a_file",
        "not_a_directory",
        "already_exists",
        "not_empty",
        "invalid_path",
        "invalid_archive",
    ],
    CapacityError: ["quota_exceeded", "unavailable", "no_space", "memory_full"],
    TimeoutError: ["request_timeout"],
    InternalError: ["internal"],
}.items():
    for _code in _codes:
        _FAMILIES[_code] = _cls


def error_for(status: int, code: Optional[str], message: str) -> BrigError:
    """The exception for a daemon's answer; unknown codes fall back on the status."""
    if code in _FAMILIES:
        return _FAMILIES[code](message, code, status)
    by_status: Dict[int, Type[BrigError]] = {
        400: InvalidRequestError,
        401: AuthenticationError,
        403: AuthenticationError,
        404: NotFoundError,
        408: TimeoutError,
        409: ConflictError,
        413: InvalidRequestError,
        422: InvalidRequestError,
        429: CapacityError,
        503: CapacityError,
        507: CapacityError,
    }
    cls = by_status.get(status, InternalError if status >= 500 else BrigError)
    return cls(message, code or f"http_{status}", status)


def error_from_body(status: int, body: bytes) -> BrigError:
    """Parses ``{"error": {"code", "message"}}``; any other body is kept as the message."""
    try:
        err = json.loads(body)["error"]
        return error_for(status, err.get("code"), err.get("message", ""))
    except (ValueError, KeyError, TypeError, AttributeError):
        text = body.decode("utf-8", "replace").strip() or f"HTTP {status}"
        return error_for(status, None, text[:500])
