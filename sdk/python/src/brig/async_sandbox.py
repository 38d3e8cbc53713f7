"""The asyncio client: :class:`AsyncSandbox`, the mirror of :class:`brig.Sandbox`.

Callbacks may be plain functions or coroutine functions."""

from __future__ import annotations

import contextlib
import inspect
import tempfile
from typing import Any, AsyncIterator, Dict, List, Literal, Mapping, Optional, Union, overload

import httpx

from . import _common as c
from .errors import BrigError, NotFoundError, TimeoutError, error_from_body
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
from .sandbox import CHUNK, _content

# Tars are built and unpacked in temporary files by blocking code: small next to the
# transfer, and kept out of the way of the event loop only as much as a file write is.


class _AsyncHttp:
    def __init__(self, url: Optional[str], api_key: Optional[str], timeout: Optional[float]):
        base, key = c.settings(url, api_key)
        self._base, self._headers = base, c.headers(key)
        self._timeout = httpx.Timeout(timeout, connect=10.0)
        self._client = self._new()

    def _new(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self._base, headers=self._headers, timeout=self._timeout, verify=c.tls()
        )

    @property
    def client(self) -> httpx.AsyncClient:
        # A closed sandbox object can still be used (e.g. killed): it reconnects.
        if self._client.is_closed:
            self._client = self._new()
        return self._client

    async def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        r = await self.client.request(method, path, **kw)
        if r.status_code >= 400:
            raise error_from_body(r.status_code, r.content)
        return r

    async def json(self, method: str, path: str, **kw: Any) -> Any:
        return (await self.request(method, path, **kw)).json()

    @contextlib.asynccontextmanager
    async def stream(self, method: str, path: str, **kw: Any) -> AsyncIterator[httpx.Response]:
        async with self.client.stream(method, path, **kw) as r:
            if r.status_code >= 400:
                raise error_from_body(r.status_code, await r.aread())
            yield r

    async def events(self, method: str, path: str, feed: Any, **kw: Any) -> None:
        """Feeds each event to ``feed`` (awaiting what a callback returns)."""
        parser = c.SSEParser()
        async with self.stream(method, path, headers={"Accept": "text/event-stream"}, **kw) as r:
            async for line in r.aiter_lines():
                event = parser.feed(line)
                if event is not None:
                    await _maybe_await(feed(*event))
            last = parser.feed("")
            if last is not None:
                await _maybe_await(feed(*last))

    async def aclose(self) -> None:
        await self._client.aclose()


async def _maybe_await(value: Any) -> None:
    if inspect.isawaitable(value):
        await value


class AsyncSandbox:
    """A brig session, for asyncio: ``async with await AsyncSandbox.create() as sbx:``."""

    def __init__(self, sandbox_id: str, *, _http: _AsyncHttp, _info: Optional[SandboxInfo] = None):
        self.sandbox_id = sandbox_id
        self._http = _http
        self._info = _info
        self._base = f"/v1/sessions/{sandbox_id}"
        self.commands = AsyncCommands(self)
        self.files = AsyncFiles(self)

    @classmethod
    async def create(
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
    ) -> "AsyncSandbox":
        http = _AsyncHttp(url, api_key, request_timeout)
        body = c.create_body(image, timeout, network, env, metadata, snapshot, limits, idle_timeout)
        try:
            info = SandboxInfo.from_json(await http.json("POST", "/v1/sessions", json=body))
        except BaseException:
            await http.aclose()
            raise
        return cls(info.sandbox_id, _http=http, _info=info)

    @classmethod
    async def connect(
        cls, sandbox_id: str, *, url: Optional[str] = None, api_key: Optional[str] = None
    ) -> "AsyncSandbox":
        http = _AsyncHttp(url, api_key, None)
        try:
            info = SandboxInfo.from_json(await http.json("GET", f"/v1/sessions/{sandbox_id}"))
        except BaseException:
            await http.aclose()
            raise
        return cls(sandbox_id, _http=http, _info=info)

    @classmethod
    async def list(
        cls,
        *,
        metadata: Optional[Mapping[str, str]] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
    ) -> List[SandboxInfo]:
        http = _AsyncHttp(url, api_key, None)
        try:
            params = [("metadata", f"{k}={v}") for k, v in (metadata or {}).items()]
            answer = await http.json("GET", "/v1/sessions", params=params)
        finally:
            await http.aclose()
        return [SandboxInfo.from_json(s) for s in answer["sessions"]]

    async def get_info(self) -> SandboxInfo:
        self._info = SandboxInfo.from_json(await self._http.json("GET", self._base))
        return self._info

    async def is_running(self) -> bool:
        try:
            return (await self.get_info()).state == "running"
        except NotFoundError:
            return False

    async def set_timeout(self, timeout: float) -> None:
        await self._http.request("PATCH", self._base, json={"ttl_seconds": max(1, int(timeout))})

    async def kill(self) -> bool:
        try:
            await self._http.request("DELETE", self._base)
            return True
        except NotFoundError:
            return False

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self.kill()
        finally:
            await self.close()

    def __repr__(self) -> str:
        return f"AsyncSandbox({self.sandbox_id!r})"

    async def snapshot(self, name: Optional[str] = None) -> Snapshot:
        body = {"name": name} if name else {}
        answer = await self._http.json("POST", f"{self._base}/snapshots", json=body)
        return Snapshot.from_json(answer)

    async def restore(self, snapshot: Union[str, Snapshot]) -> None:
        body = {"snapshot_id": c.snapshot_id(snapshot)}
        await self._http.request("POST", f"{self._base}/restore", json=body)

    async def delete_snapshot(self, snapshot: Union[str, Snapshot]) -> None:
        await self._http.request("DELETE", f"/v1/snapshots/{c.snapshot_id(snapshot)}")

    async def run_code(
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
        body: Dict[str, Any] = {"code": code, "stream": True}
        if context is not None:
            body["context_id"] = c.context_id(context)
        if timeout is not None:
            body["timeout_ms"] = c.ms(timeout)
        stream = c.CodeStream(on_stdout, on_stderr, on_result, on_error)
        await self._http.events("POST", f"{self._base}/code", stream.feed, json=body)
        return stream.finish()

    async def create_code_context(self, cwd: Optional[str] = None) -> Context:
        body = {"cwd": cwd} if cwd else {}
        return Context.from_json(await self._http.json("POST", f"{self._base}/contexts", json=body))

    async def list_code_contexts(self) -> List[Context]:
        answer = await self._http.json("GET", f"{self._base}/contexts")
        return [Context.from_json(x) for x in answer["contexts"]]

    async def restart_code_context(self, context: Union[str, Context]) -> Context:
        path = f"{self._base}/contexts/{c.context_id(context)}/restart"
        return Context.from_json(await self._http.json("POST", path))

    async def remove_code_context(self, context: Union[str, Context]) -> None:
        await self._http.request("DELETE", f"{self._base}/contexts/{c.context_id(context)}")


class AsyncCommandHandle:
    def __init__(
        self,
        sandbox: AsyncSandbox,
        pid: int,
        on_stdout: c.Callback = None,
        on_stderr: c.Callback = None,
        timeout: Optional[float] = None,
    ):
        self.pid = pid
        self._sbx = sandbox
        self._path = f"{sandbox._base}/processes/{pid}"
        self._on_stdout, self._on_stderr, self._timeout = on_stdout, on_stderr, timeout

    async def info(self) -> ProcessInfo:
        return ProcessInfo.from_json(await self._sbx._http.json("GET", self._path))

    async def send_stdin(self, data: Union[str, bytes], *, close: bool = False) -> None:
        content = data.encode() if isinstance(data, str) else data
        params = {"close": "true"} if close else None
        await self._sbx._http.request("POST", f"{self._path}/stdin", content=content, params=params)

    async def close_stdin(self) -> None:
        await self.send_stdin(b"", close=True)

    async def kill(self, signal: Union[str, int] = "KILL") -> None:
        await self._sbx._http.request("POST", f"{self._path}/signal", json={"signal": signal})

    async def output(self, stream: Literal["stdout", "stderr"] = "stdout", offset: int = 0) -> str:
        params = {"stream": stream, "offset": str(offset)}
        return (await self._sbx._http.request("GET", f"{self._path}/output", params=params)).text

    async def wait(
        self,
        timeout: Optional[float] = None,
        *,
        on_stdout: c.Callback = None,
        on_stderr: c.Callback = None,
    ) -> CommandResult:
        timeout = self._timeout if timeout is None else timeout
        if timeout is not None:
            params = {"timeout_ms": str(c.ms(timeout))}
            state = await self._sbx._http.json("POST", f"{self._path}/wait", params=params)
            if state.get("state") == "running":
                raise TimeoutError(
                    f"process {self.pid} still runs after {timeout}s", "wait_timeout"
                )
        stream = c.CommandStream(on_stdout or self._on_stdout, on_stderr or self._on_stderr)
        await self._sbx._http.events("GET", f"{self._path}/stream", stream.feed)
        return stream.result()


class AsyncCommands:
    def __init__(self, sandbox: AsyncSandbox):
        self._sbx = sandbox

    @overload
    async def run(
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
    async def run(
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
    ) -> AsyncCommandHandle: ...

    async def run(
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
    ) -> Union[CommandResult, AsyncCommandHandle]:
        """As :meth:`brig.Commands.run`: a CommandResult, or with ``background=True``
        an :class:`AsyncCommandHandle`."""
        body = c.command_body(cmd, cwd, env)
        http = self._sbx._http
        if background:
            proc = await http.json("POST", f"{self._sbx._base}/processes", json=body)
            handle = AsyncCommandHandle(
                self._sbx, proc["process_id"], on_stdout, on_stderr, timeout
            )
            if stdin is not None:
                await handle.send_stdin(stdin, close=True)
            return handle
        if timeout is not None:
            body["timeout_ms"] = c.ms(timeout)
        if stdin is not None:
            body["stdin"] = stdin.decode() if isinstance(stdin, bytes) else stdin
        if on_stdout is None and on_stderr is None:
            answer = await http.json("POST", f"{self._sbx._base}/exec", json=body)
            return CommandResult.from_json(answer)
        stream = c.CommandStream(on_stdout, on_stderr)
        await http.events("POST", f"{self._sbx._base}/exec/stream", stream.feed, json=body)
        return stream.result()

    async def list(self) -> List[ProcessInfo]:
        answer = await self._sbx._http.json("GET", f"{self._sbx._base}/processes")
        return [ProcessInfo.from_json(p) for p in answer["processes"]]

    async def connect(self, pid: int) -> AsyncCommandHandle:
        handle = AsyncCommandHandle(self._sbx, pid)
        await handle.info()
        return handle


class AsyncFiles:
    def __init__(self, sandbox: AsyncSandbox):
        self._sbx = sandbox
        self._files = f"{sandbox._base}/files"
        self._dir = f"{sandbox._base}/dir"

    async def read(self, path: str, format: str = "text") -> Any:
        """``"text"`` (str), ``"bytes"``, or ``"stream"``: an async iterator of chunks."""
        if format == "stream":
            return self._chunks(path)
        r = await self._sbx._http.request("GET", self._files, params={"path": path})
        return r.content if format == "bytes" else r.content.decode("utf-8")

    async def _chunks(self, path: str) -> AsyncIterator[bytes]:
        async with self._sbx._http.stream("GET", self._files, params={"path": path}) as r:
            async for chunk in r.aiter_bytes(CHUNK):
                yield chunk

    async def write(self, path: str, data: Any) -> WriteInfo:
        """``data``: str, bytes, a binary file, or a (sync or async) iterable of bytes."""
        content = _async_content(data)
        answer = await self._sbx._http.json(
            "PUT", self._files, params={"path": path}, content=content
        )
        return WriteInfo(path=answer["path"], size=answer["size_bytes"])

    async def list(self, path: str = "/workspace") -> List[EntryInfo]:
        return c.entries(await self._sbx._http.json("GET", self._dir, params={"path": path}))

    async def make_dir(self, path: str) -> None:
        await self._sbx._http.request("POST", self._dir, params={"path": path})

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        params = {"path": path, "recursive": "true" if recursive else "false"}
        await self._sbx._http.request("DELETE", self._files, params=params)

    async def exists(self, path: str) -> bool:
        parent, _, name = path.rstrip("/").rpartition("/")
        try:
            return any(e.name == name for e in await self.list(parent or "/"))
        except NotFoundError:
            return False

    async def upload_dir(self, local_dir: str, path: str) -> int:
        with c.pack_dir(local_dir) as archive:
            answer = await self._sbx._http.json(
                "PUT",
                f"{self._sbx._base}/archive",
                params={"path": path},
                content=_async_content(archive),
                headers={"Content-Type": "application/x-tar"},
            )
        return int(answer.get("entries", 0))

    async def download_dir(self, path: str, local_dir: str) -> None:
        with tempfile.TemporaryFile() as archive:
            params = {"path": path}
            async with self._sbx._http.stream(
                "GET", f"{self._sbx._base}/archive", params=params
            ) as r:
                async for chunk in r.aiter_bytes(CHUNK):
                    archive.write(chunk)
            c.unpack_into(archive, local_dir)


def _async_content(data: Any) -> Any:
    """httpx's AsyncClient streams only async iterables: a file or a sync iterable is
    wrapped (reading a chunk of a local file is short next to sending it)."""
    if hasattr(data, "__aiter__"):
        return data
    content = _content(data)
    if isinstance(content, bytes):
        return content
    return _wrap(content)


async def _wrap(chunks: Any) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


__all__ = ["AsyncSandbox", "AsyncCommands", "AsyncCommandHandle", "AsyncFiles", "BrigError"]
