"""What the sync and async clients share: settings, request bodies, event parsing."""

from __future__ import annotations

import json
import os
import posixpath
import ssl
import tarfile
import threading
from typing import IO, Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

from .errors import BrigError, error_for
from .models import (
    CommandResult,
    Context,
    EntryInfo,
    Execution,
    ExecutionError,
    Result,
    Snapshot,
)

DEFAULT_URL = "http://127.0.0.1:7700"

Network = Union[str, Mapping[str, Any], None]
ContextRef = Union[str, Context, None]
SnapshotRef = Union[str, Snapshot, None]
Callback = Optional[Callable[[Any], Any]]


def settings(url: Optional[str], api_key: Optional[str]) -> Tuple[str, Optional[str]]:
    """Arguments first, then ``BRIG_URL`` / ``BRIG_API_KEY`` (as the CLI; empty is unset)."""
    url = url or os.environ.get("BRIG_URL") or DEFAULT_URL
    api_key = api_key or os.environ.get("BRIG_API_KEY") or None
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"bad daemon URL {url!r}: expected http(s)://HOST:PORT")
    return url.rstrip("/"), api_key


def headers(api_key: Optional[str]) -> Dict[str, str]:
    h = {"User-Agent": "brig-sandbox-python/0.1.0"}
    if api_key:
        h["Authorization"] = f"Bearer {api_key}"
    return h


def create_body(
    image: Optional[str],
    timeout: Optional[float],
    network: Network,
    env: Optional[Mapping[str, str]],
    metadata: Optional[Mapping[str, str]],
    snapshot: SnapshotRef,
    limits: Optional[Mapping[str, Any]],
    idle_timeout: Optional[float],
) -> Dict[str, Any]:
    body: Dict[str, Any] = {}
    if image is not None:
        body["image"] = image
    if timeout is not None:
        body["ttl_seconds"] = max(1, int(timeout))
    if idle_timeout is not None:
        body["idle_timeout_seconds"] = int(idle_timeout)
    if network is not None:
        body["network"] = {"mode": network} if isinstance(network, str) else dict(network)
    if env:
        body["env"] = dict(env)
    if metadata:
        body["metadata"] = dict(metadata)
    if snapshot is not None:
        body["snapshot"] = snapshot_id(snapshot)
    if limits:
        body["limits"] = dict(limits)
    return body


def snapshot_id(snapshot: Union[str, Snapshot]) -> str:
    return snapshot.snapshot_id if isinstance(snapshot, Snapshot) else snapshot


def context_id(context: ContextRef) -> Optional[str]:
    return context.id if isinstance(context, Context) else context


def ms(seconds: Optional[float]) -> Optional[int]:
    return None if seconds is None else max(1, int(seconds * 1000))


def command_body(
    cmd: Union[str, List[str]],
    cwd: Optional[str],
    env: Optional[Mapping[str, str]],
) -> Dict[str, Any]:
    body: Dict[str, Any] = {"argv": list(cmd)} if isinstance(cmd, list) else {"cmd": cmd}
    if cwd is not None:
        body["cwd"] = cwd
    if env:
        body["env"] = dict(env)
    return body


def entries(listing: Dict[str, Any]) -> List[EntryInfo]:
    base = listing.get("path", "/")
    return [
        EntryInfo(
            name=e["name"],
            path=posixpath.join(base, e["name"]),
            kind=e.get("kind", "other"),
            size=e.get("size_bytes", 0),
            mode=e.get("mode", 0),
            modified_at=e.get("modified_at"),
        )
        for e in listing.get("entries", [])
    ]


class SSEParser:
    """Server-Sent Events, fed line by line: yields ``(event, data)`` per event.

    Small enough to keep by hand: ``event:`` and ``data:`` fields, comments and
    blank-line dispatch are all brig sends."""

    def __init__(self) -> None:
        self._event = "message"
        self._data: List[str] = []

    def feed(self, line: str) -> Optional[Tuple[str, Any]]:
        line = line.rstrip("\r\n")
        if not line:
            if not self._data:
                self._event = "message"
                return None
            event, data = self._event, "\n".join(self._data)
            self._event, self._data = "message", []
            return event, json.loads(data)
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return None


class CommandStream:
    """Collects a command's events (exec stream, a process's stream)."""

    def __init__(self, on_stdout: Callback, on_stderr: Callback) -> None:
        self.on = {"stdout": on_stdout, "stderr": on_stderr}
        self.out: Dict[str, List[str]] = {"stdout": [], "stderr": []}
        self.exit: Optional[Dict[str, Any]] = None

    def feed(self, event: str, data: Any) -> Any:
        """Handles one event; returns what a callback returned (an awaitable, maybe)."""
        if event in self.out:
            self.out[event].append(data["data"])
            cb = self.on[event]
            return cb(data["data"]) if cb else None
        if event == "exit":
            self.exit = data
        elif event == "error":
            raise error_for(500, data.get("code"), data.get("message", ""))
        return None

    def result(self) -> CommandResult:
        if self.exit is None:
            raise BrigError("the command's stream ended without its exit", "stream_cut")
        return CommandResult.from_json(
            self.exit, "".join(self.out["stdout"]), "".join(self.out["stderr"])
        )


class CodeStream:
    """Collects ``run_code`` events into an :class:`Execution`."""

    def __init__(
        self, on_stdout: Callback, on_stderr: Callback, on_result: Callback, on_error: Callback
    ) -> None:
        self.execution = Execution()
        self.on_stdout, self.on_stderr = on_stdout, on_stderr
        self.on_result, self.on_error = on_result, on_error
        self.ended = False

    def feed(self, event: str, data: Any) -> Any:
        ex = self.execution
        if event == "stdout":
            ex.logs.stdout.append(data["data"])
            return self.on_stdout(data["data"]) if self.on_stdout else None
        if event == "stderr":
            ex.logs.stderr.append(data["data"])
            return self.on_stderr(data["data"]) if self.on_stderr else None
        if event == "result":
            result = Result(data=data.get("data") or {}, is_main_result=bool(data.get("main")))
            ex.results.append(result)
            return self.on_result(result) if self.on_result else None
        if event == "error":
            ex.error = ExecutionError(
                name=data.get("name", ""),
                value=data.get("value", ""),
                traceback=data.get("traceback", ""),
            )
            return self.on_error(ex.error) if self.on_error else None
        if event == "end":
            self.ended = True
            ex.context_id = data.get("context_id")
            ex.execution_count = data.get("execution_count")
            ex.timed_out = bool(data.get("timed_out"))
            ex.duration_ms = data.get("duration_ms")
        return None

    def finish(self) -> Execution:
        if not self.ended:
            raise BrigError("the code's stream ended without its end event", "stream_cut")
        return self.execution


def pack_dir(local_dir: str) -> IO[bytes]:
    """A tar of ``local_dir``'s contents, in a temporary file (spills to disk, not memory)."""
    import tempfile

    if not os.path.isdir(local_dir):
        raise NotADirectoryError(local_dir)
    out = tempfile.TemporaryFile()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name in sorted(os.listdir(local_dir)):
            tar.add(os.path.join(local_dir, name), arcname=name)
    out.seek(0)
    return out


def unpack_into(archive: Any, local_dir: str) -> None:
    """Extracts a downloaded tar; names that would leave ``local_dir`` are refused."""
    os.makedirs(local_dir, exist_ok=True)
    archive.seek(0)
    with tarfile.open(fileobj=archive, mode="r|") as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(local_dir, filter="data")
        else:  # Python < 3.11.4 has no extraction filters.
            root = os.path.realpath(local_dir)
            for member in tar:
                target = os.path.realpath(os.path.join(local_dir, member.name))
                if not (target == root or target.startswith(root + os.sep)):
                    message = f"archive entry {member.name!r} leaves the directory"
                    raise BrigError(message, "invalid_archive")
                if member.issym() or member.islnk() or member.isdev():
                    continue
                tar.extract(member, local_dir)


_tls_lock = threading.Lock()
_tls: Optional[ssl.SSLContext] = None


def tls() -> ssl.SSLContext:
    """One TLS context for every client: making one loads the CA bundle, which cost
    each ``Sandbox.create()`` about 20 ms when every sandbox made its own."""
    global _tls
    with _tls_lock:
        if _tls is None:
            import httpx

            _tls = httpx.create_ssl_context()
        return _tls
