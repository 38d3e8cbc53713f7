"""The synchronous client: :class:`Sandbox` and what hangs off it."""

from __future__ import annotations

import contextlib
import tempfile
from typing import Any, Dict, Iterator, List, Literal, Mapping, Optional, Tuple, Union, overload

import httpx

from . import _common as c
from .errors import BrigError, NotFoundError, TimeoutError
from .models import (
    CommandResult,
    Context,
    EntryInfo,
    Execution,
    ProcessInfo,
    SandboxInfo,
    Snapshot,
    WriteInfo,
)

CHUNK = 64 * 1024


class _Http:
    """One daemon connection pool; every non-2xx answer is raised as a BrigError."""

    def __init__(self, url: Optional[str], api_key: Optional[str], timeout: Optional[float]):
        base, key = c.settings(url, api_key)
        # Reads wait as long as the daemon works (a command, a stream); the daemon
        # bounds those itself with each request's own timeout.
        self._base, self._headers = base, c.headers(key)
        self._timeout = httpx.Timeout(timeout, connect=10.0)
        self._client = self._new()

    def _new(self) -> httpx.Client:
        return httpx.Client(
            base_url=self._base, headers=self._headers, timeout=self._timeout, verify=c.tls()
        )

    @property
    def client(self) -> httpx.Client:
        # A closed sandbox object can still be used (e.g. killed): it reconnects.
        if self._client.is_closed:
            self._client = self._new()
        return self._client

    def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        r = self.client.request(method, path, **kw)
        if r.status_code >= 400:
            raise _error(r, r.content)
        return r

    def json(self, method: str, path: str, **kw: Any) -> Any:
        return self.request(method, path, **kw).json()

    @contextlib.contextmanager
    def stream(self, method: str, path: str, **kw: Any) -> Iterator[httpx.Response]:
        with self.client.stream(method, path, **kw) as r:
            if r.status_code >= 400:
                raise _error(r, r.read())
            yield r

    def events(self, method: str, path: str, **kw: Any) -> Iterator[Tuple[str, Any]]:
        parser = c.SSEParser()
        with self.stream(method, path, headers={"Accept": "text/event-stream"}, **kw) as r:
            for line in r.iter_lines():
                event = parser.feed(line)
                if event is not None:
                    yield event
            # A last event not followed by a blank line still counts.
            last = parser.feed("")
            if last is not None:
                yield last

    def close(self) -> None:
        self._client.close()


def _error(r: httpx.Response, body: bytes) -> BrigError:
    from .errors import error_from_body

    return error_from_body(r.status_code, body)


class Sandbox:
    """A brig session: a live sandbox that keeps its files and processes between calls.

    ``Sandbox.create()`` starts one; ``with Sandbox.create() as sbx:`` kills it at the end.
    The daemon is ``url`` (else ``BRIG_URL``, else http://127.0.0.1:7700), the key
    ``api_key`` (else ``BRIG_API_KEY``)."""

    def __init__(self, sandbox_id: str, *, _http: _Http, _info: Optional[SandboxInfo] = None):
        self.sandbox_id = sandbox_id
        self._http = _http
        self._info = _info
        self._base = f"/v1/sessions/{sandbox_id}"
        self.commands = Commands(self)
        self.files = Files(self)

    @classmethod
    def create(
        cls,
        image: Optional[str] = None,
        *,
        timeout: Optional[float] = None,
        network: c.Network = None,
        env: Optional[Mapping[str, str]] = None,
        metadata: Optional[Mapping[str, str]] = None,
        snapshot: c.SnapshotRef = None,
        limits: Optional[Mapping[str, Any]] = None,
        idle_timeout: Optional[float] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        request_timeout: Optional[float] = None,
    ) -> "Sandbox":
        """Starts a sandbox. ``timeout``: seconds it lives (the session's TTL);
        ``network``: ``"none"``, ``"open"``, or ``{"mode": "allow", "allow": [...]}``;
        ``snapshot``: fork from a :class:`Snapshot` (or its id)."""
        http = _Http(url, api_key, request_timeout)
        body = c.create_body(image, timeout, network, env, metadata, snapshot, limits, idle_timeout)
        try:
            info = SandboxInfo.from_json(http.json("POST", "/v1/sessions", json=body))
        except BaseException:
            http.close()
            raise
        return cls(info.sandbox_id, _http=http, _info=info)

    @classmethod
    def connect(
        cls, sandbox_id: str, *, url: Optional[str] = None, api_key: Optional[str] = None
    ) -> "Sandbox":
        """Attaches to a running sandbox (NotFoundError if it is gone)."""
        http = _Http(url, api_key, None)
        try:
            info = SandboxInfo.from_json(http.json("GET", f"/v1/sessions/{sandbox_id}"))
        except BaseException:
            http.close()
            raise
        return cls(sandbox_id, _http=http, _info=info)

    @classmethod
    def list(
        cls,
        *,
        metadata: Optional[Mapping[str, str]] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
    ) -> List[SandboxInfo]:
        """The caller's sandboxes, those labelled with all of ``metadata`` if given."""
        http = _Http(url, api_key, None)
        try:
            params = [("metadata", f"{k}={v}") for k, v in (metadata or {}).items()]
            answer = http.json("GET", "/v1/sessions", params=params)
        finally:
            http.close()
        return [SandboxInfo.from_json(s) for s in answer["sessions"]]

    def get_info(self) -> SandboxInfo:
        self._info = SandboxInfo.from_json(self._http.json("GET", self._base))
        return self._info

    def is_running(self) -> bool:
        try:
            return self.get_info().state == "running"
        except NotFoundError:
            return False

    def set_timeout(self, timeout: float) -> None:
        """The sandbox now ends ``timeout`` seconds from now."""
        self._http.request("PATCH", self._base, json={"ttl_seconds": max(1, int(timeout))})

    def kill(self) -> bool:
        """Deletes the sandbox; False if it was already gone."""
        try:
            self._http.request("DELETE", self._base)
            return True
        except NotFoundError:
            return False

    def close(self) -> None:
        """Closes the connection (the sandbox runs on; ``kill`` ends it)."""
        self._http.close()

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.kill()
        finally:
            self.close()

    def __repr__(self) -> str:
        return f"Sandbox({self.sandbox_id!r})"

    # Snapshots

    def snapshot(self, name: Optional[str] = None) -> Snapshot:
        """Snapshots the sandbox's files; ``Sandbox.create(snapshot=...)`` forks from it."""
        body = {"name": name} if name else {}
        return Snapshot.from_json(self._http.json("POST", f"{self._base}/snapshots", json=body))

    def restore(self, snapshot: Union[str, Snapshot]) -> None:
        """Replaces this sandbox's contents with the snapshot's (its processes end)."""
        body = {"snapshot_id": c.snapshot_id(snapshot)}
        self._http.request("POST", f"{self._base}/restore", json=body)

    def delete_snapshot(self, snapshot: Union[str, Snapshot]) -> None:
        self._http.request("DELETE", f"/v1/snapshots/{c.snapshot_id(snapshot)}")

    # The stateful interpreter

    def run_code(
        self,
        code: str,
        context: c.ContextRef = None,
        *,
        on_stdout: c.Callback = None,
        on_stderr: c.Callback = None,
        on_result: c.Callback = None,
        on_error: c.Callback = None,
        timeout: Optional[float] = None,
    ) -> Execution:
        """Runs Python in a context that keeps its state (the sandbox's ``default`` one
        unless given). An exception in the code is ``Execution.error``, not raised;
        a timeout interrupts the code and keeps the state (``timed_out``)."""
        body: Dict[str, Any] = {"code": code, "stream": True}
        if context is not None:
            body["context_id"] = c.context_id(context)
        if timeout is not None:
            body["timeout_ms"] = c.ms(timeout)
        stream = c.CodeStream(on_stdout, on_stderr, on_result, on_error)
        for event, data in self._http.events("POST", f"{self._base}/code", json=body):
            stream.feed(event, data)
        return stream.finish()

    def create_code_context(self, cwd: Optional[str] = None) -> Context:
        body = {"cwd": cwd} if cwd else {}
        return Context.from_json(self._http.json("POST", f"{self._base}/contexts", json=body))

    def list_code_contexts(self) -> List[Context]:
        answer = self._http.json("GET", f"{self._base}/contexts")
        return [Context.from_json(x) for x in answer["contexts"]]

    def restart_code_context(self, context: Union[str, Context]) -> Context:
        path = f"{self._base}/contexts/{c.context_id(context)}/restart"
        return Context.from_json(self._http.json("POST", path))

    def remove_code_context(self, context: Union[str, Context]) -> None:
        self._http.request("DELETE", f"{self._base}/contexts/{c.context_id(context)}")


class CommandHandle:
    """A background process: wait for it, write to its stdin, kill it."""

    def __init__(
        self,
        sandbox: Sandbox,
        pid: int,
        on_stdout: c.Callback = None,
        on_stderr: c.Callback = None,
        timeout: Optional[float] = None,
    ):
        self.pid = pid
        self._sbx = sandbox
        self._path = f"{sandbox._base}/processes/{pid}"
        self._on_stdout, self._on_stderr, self._timeout = on_stdout, on_stderr, timeout

    def info(self) -> ProcessInfo:
        return ProcessInfo.from_json(self._sbx._http.json("GET", self._path))

    def send_stdin(self, data: Union[str, bytes], *, close: bool = False) -> None:
        content = data.encode() if isinstance(data, str) else data
        params = {"close": "true"} if close else None
        self._sbx._http.request("POST", f"{self._path}/stdin", content=content, params=params)

    def close_stdin(self) -> None:
        self.send_stdin(b"", close=True)

    def kill(self, signal: Union[str, int] = "KILL") -> None:
        self._sbx._http.request("POST", f"{self._path}/signal", json={"signal": signal})

    def output(self, stream: Literal["stdout", "stderr"] = "stdout", offset: int = 0) -> str:
        """What the process has written so far to ``stream``."""
        params = {"stream": stream, "offset": str(offset)}
        return self._sbx._http.request("GET", f"{self._path}/output", params=params).text

    def wait(
        self,
        timeout: Optional[float] = None,
        *,
        on_stdout: c.Callback = None,
        on_stderr: c.Callback = None,
    ) -> CommandResult:
        """Waits for the process to end, passing its output (from the start) to the
        callbacks. With ``timeout`` (seconds), a process still running then raises
        :class:`brig.errors.TimeoutError` and runs on."""
        timeout = self._timeout if timeout is None else timeout
        if timeout is not None:
            params = {"timeout_ms": str(c.ms(timeout))}
            state = self._sbx._http.json("POST", f"{self._path}/wait", params=params)
            if state.get("state") == "running":
                raise TimeoutError(
                    f"process {self.pid} still runs after {timeout}s", "wait_timeout"
                )
        stream = c.CommandStream(on_stdout or self._on_stdout, on_stderr or self._on_stderr)
        for event, data in self._sbx._http.events("GET", f"{self._path}/stream"):
            stream.feed(event, data)
        return stream.result()


class Commands:
    """``sandbox.commands``: run commands, in the foreground or the background."""

    def __init__(self, sandbox: Sandbox):
        self._sbx = sandbox

    @overload
    def run(
        self,
        cmd: Union[str, List[str]],
        *,
        background: Literal[False] = False,
        on_stdout: c.Callback = None,
        on_stderr: c.Callback = None,
        timeout: Optional[float] = None,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        stdin: Optional[Union[str, bytes]] = None,
    ) -> CommandResult: ...

    @overload
    def run(
        self,
        cmd: Union[str, List[str]],
        *,
        background: Literal[True],
        on_stdout: c.Callback = None,
        on_stderr: c.Callback = None,
        timeout: Optional[float] = None,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        stdin: Optional[Union[str, bytes]] = None,
    ) -> CommandHandle: ...

    def run(
        self,
        cmd: Union[str, List[str]],
        *,
        background: bool = False,
        on_stdout: c.Callback = None,
        on_stderr: c.Callback = None,
        timeout: Optional[float] = None,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        stdin: Optional[Union[str, bytes]] = None,
    ) -> Union[CommandResult, CommandHandle]:
        """Runs ``cmd`` (a shell line, or an argv list). In the foreground: waits and
        returns a :class:`CommandResult` (``timeout`` seconds kills it), streaming
        output to the callbacks as it comes. With ``background=True``: returns a
        :class:`CommandHandle` at once (``timeout`` becomes its ``wait``'s)."""
        body = c.command_body(cmd, cwd, env)
        http = self._sbx._http
        if background:
            proc = http.json("POST", f"{self._sbx._base}/processes", json=body)
            handle = CommandHandle(self._sbx, proc["process_id"], on_stdout, on_stderr, timeout)
            if stdin is not None:
                handle.send_stdin(stdin, close=True)
            return handle
        if timeout is not None:
            body["timeout_ms"] = c.ms(timeout)
        if stdin is not None:
            body["stdin"] = stdin.decode() if isinstance(stdin, bytes) else stdin
        if on_stdout is None and on_stderr is None:
            return CommandResult.from_json(http.json("POST", f"{self._sbx._base}/exec", json=body))
        stream = c.CommandStream(on_stdout, on_stderr)
        for event, data in http.events("POST", f"{self._sbx._base}/exec/stream", json=body):
            stream.feed(event, data)
        return stream.result()

    def list(self) -> List[ProcessInfo]:
        answer = self._sbx._http.json("GET", f"{self._sbx._base}/processes")
        return [ProcessInfo.from_json(p) for p in answer["processes"]]

    def connect(self, pid: int) -> CommandHandle:
        handle = CommandHandle(self._sbx, pid)
        handle.info()  # NotFoundError now rather than at first use
        return handle


class Files:
    """``sandbox.files``: absolute paths inside the sandbox."""

    def __init__(self, sandbox: Sandbox):
        self._sbx = sandbox
        self._files = f"{sandbox._base}/files"
        self._dir = f"{sandbox._base}/dir"

    @overload
    def read(self, path: str, format: Literal["text"] = "text") -> str: ...
    @overload
    def read(self, path: str, format: Literal["bytes"]) -> bytes: ...
    @overload
    def read(self, path: str, format: Literal["stream"]) -> Iterator[bytes]: ...

    def read(self, path: str, format: str = "text") -> Union[str, bytes, Iterator[bytes]]:
        """A file's content: text (UTF-8), bytes, or a stream of chunks (read it to
        the end, or close it, to free the connection)."""
        if format == "stream":
            return self._chunks(path)
        r = self._sbx._http.request("GET", self._files, params={"path": path})
        return r.content if format == "bytes" else r.content.decode("utf-8")

    def _chunks(self, path: str) -> Iterator[bytes]:
        with self._sbx._http.stream("GET", self._files, params={"path": path}) as r:
            yield from r.iter_bytes(CHUNK)

    def write(self, path: str, data: Any) -> WriteInfo:
        """Writes ``data`` (str, bytes, a binary file object or an iterable of bytes,
        streamed) to ``path``, making its parent directories."""
        content = _content(data)
        answer = self._sbx._http.json("PUT", self._files, params={"path": path}, content=content)
        return WriteInfo(path=answer["path"], size=answer["size_bytes"])

    def list(self, path: str = "/workspace") -> List[EntryInfo]:
        return c.entries(self._sbx._http.json("GET", self._dir, params={"path": path}))

    def make_dir(self, path: str) -> None:
        """Makes ``path`` and its parents (as ``mkdir -p``)."""
        self._sbx._http.request("POST", self._dir, params={"path": path})

    def remove(self, path: str, *, recursive: bool = False) -> None:
        params = {"path": path, "recursive": "true" if recursive else "false"}
        self._sbx._http.request("DELETE", self._files, params=params)

    def exists(self, path: str) -> bool:
        parent, _, name = path.rstrip("/").rpartition("/")
        try:
            return any(e.name == name for e in self.list(parent or "/"))
        except NotFoundError:
            return False

    def upload_dir(self, local_dir: str, path: str) -> int:
        """Copies ``local_dir``'s contents beneath ``path`` (one tar, all or nothing);
        returns how many entries landed."""
        with c.pack_dir(local_dir) as archive:
            answer = self._sbx._http.json(
                "PUT",
                f"{self._sbx._base}/archive",
                params={"path": path},
                content=_chunked(archive),
                headers={"Content-Type": "application/x-tar"},
            )
        return int(answer.get("entries", 0))

    def download_dir(self, path: str, local_dir: str) -> None:
        """Copies what is in the directory ``path`` into ``local_dir`` (made if missing)."""
        with tempfile.TemporaryFile() as archive:
            params = {"path": path}
            with self._sbx._http.stream("GET", f"{self._sbx._base}/archive", params=params) as r:
                for chunk in r.iter_bytes(CHUNK):
                    archive.write(chunk)
            c.unpack_into(archive, local_dir)


def _chunked(f: Any) -> Iterator[bytes]:
    while True:
        chunk = f.read(CHUNK)
        if not chunk:
            return
        yield chunk


def _content(data: Any) -> Any:
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    if hasattr(data, "read"):
        return _chunked(data)
    return data  # an iterable of bytes
