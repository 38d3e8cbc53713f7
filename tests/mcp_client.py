"""brig's MCP server driven by the official Python MCP client (`mcp`, its `Client`).

Run by tests/mcp.rs with the Python that scripts/test.sh installs `mcp` into:

    mcp_client.py stdio BRIG DATA_DIR STORE     tools end to end over `brig mcp`
    mcp_client.py stdio-daemon BRIG URL KEY     the same, `brig mcp` a client of the
                                                daemon at URL; the sandbox ends with stdin
    mcp_client.py http URL KEY                  tools end to end over /mcp; the
                                                sandbox ends with the MCP session
    mcp_client.py expiry URL KEY                a client gone without ending its session:
                                                the sandbox ends when the session expires
    mcp_client.py recreate URL KEY              a sandbox deleted under a live MCP session
                                                is replaced on the next call
    mcp_client.py nokey URL                     /mcp refuses a request without a key
    mcp_client.py containment URL KEY HOSTFILE  read_file cannot reach HOSTFILE
    mcp_client.py isolation URL KEY             one MCP session cannot see another's files

Prints `ok` and exits 0 when every check holds; an assertion names the one that failed.
"""

import asyncio
import sys
import time

import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client


def text(result):
    return "".join(block.text for block in result.content if block.type == "text")


async def call(client, name, arguments):
    return await client.call_tool(name, arguments)


async def ok(client, name, arguments):
    result = await call(client, name, arguments)
    assert not result.is_error, f"{name} {arguments}: {text(result)}"
    return text(result)


async def error(client, name, arguments):
    result = await call(client, name, arguments)
    assert result.is_error, f"{name} {arguments} should fail: {text(result)}"
    return text(result)


def http_client(url, key, terminate_on_close=True):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(120.0))
    transport = streamable_http_client(url + "/mcp", http_client=http, terminate_on_close=terminate_on_close)
    return Client(transport, read_timeout_seconds=120)


async def exercise(client):
    """Every tool does its work, and says clearly when it fails."""
    tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    for name in ["run_command", "write_file", "read_file", "list_files", "run_code", "snapshot", "restore"]:
        assert name in tools, f"no tool {name}: {sorted(tools)}"
        assert len(tools[name].description) > 40, f"{name} has no real description"

    out = await ok(client, "write_file", {"path": "hello.py", "content": "print('hi from brig')\n"})
    assert "hello.py" in out, out
    assert await ok(client, "read_file", {"path": "/workspace/hello.py"}) == "print('hi from brig')\n"
    out = await ok(client, "run_command", {"command": "python3 hello.py && echo err >&2"})
    assert "exit code 0" in out and "hi from brig" in out and "err" in out, out
    # State persists between calls: one sandbox for the session.
    await ok(client, "run_command", {"command": "mkdir -p sub && echo x > sub/data.txt"})
    listing = await ok(client, "list_files", {})
    assert "hello.py" in listing and "sub/" in listing, listing
    assert "data.txt" in await ok(client, "list_files", {"path": "sub"})

    # A non-zero exit is a tool error that says so, with the output.
    out = await error(client, "run_command", {"command": "echo partial; exit 3"})
    assert "exit code 3" in out and "partial" in out, out
    out = await error(client, "run_command", {"command": "sleep 30", "timeout_ms": 500})
    assert "timed out" in out, out

    # Binary and missing files are reported as such.
    await ok(client, "run_command", {"command": "printf '\\000\\001\\002' > blob.bin"})
    assert "binary" in await error(client, "read_file", {"path": "blob.bin"})
    out = await error(client, "read_file", {"path": "nothing-here.txt"})
    assert "no such file" in out, out

    # run_code keeps its state; an exception is a tool error with its traceback,
    # and the state survives it; a chart comes back as an image.
    await ok(client, "run_code", {"code": "x = 21\nprint('set')"})
    assert "42" in await ok(client, "run_code", {"code": "x * 2"})
    out = await error(client, "run_code", {"code": "def f():\n    return 1 / 0\nf()"})
    assert "ZeroDivisionError" in out and ("Traceback" in out or "line" in out), out
    assert "42" in await ok(client, "run_code", {"code": "x * 2"})
    has_matplotlib = "exit code 0" in (await call(client, "run_command", {"command": "python3 -c 'import matplotlib'"})).content[0].text
    if has_matplotlib:
        result = await call(client, "run_code", {"code": "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])"})
        assert not result.is_error, text(result)
        images = [block for block in result.content if block.type == "image"]
        assert images and images[0].mime_type == "image/png", result.content

    # A snapshot is a checkpoint of the files; restore goes back to it.
    await ok(client, "write_file", {"path": "keep.txt", "content": "before"})
    out = await ok(client, "snapshot", {"name": "checkpoint"})
    snap = out.split()[2].rstrip(":")
    assert snap.startswith("snap"), out
    await ok(client, "write_file", {"path": "keep.txt", "content": "after"})
    await ok(client, "write_file", {"path": "new.txt", "content": "x"})
    await ok(client, "restore", {"snapshot_id": snap})
    assert await ok(client, "read_file", {"path": "keep.txt"}) == "before"
    assert "new.txt" not in await ok(client, "list_files", {})
    assert "not_found" in await error(client, "restore", {"snapshot_id": "snap_nope"})

    # Invalid arguments: a tool error naming the argument.
    for name, arguments, named in [
        ("restore", {}, "snapshot_id"),
        ("snapshot", {"name": 3}, "name"),
        ("run_code", {}, "code"),
        ("run_code", {"code": "1", "timeout_ms": 0}, "timeout_ms"),
        ("run_command", {}, "command"),
        ("run_command", {"command": 5}, "command"),
        ("run_command", {"command": "true", "timeout_ms": "soon"}, "timeout_ms"),
        ("run_command", {"command": "true", "timeout_ms": -1}, "timeout_ms"),
        ("write_file", {"path": "a.txt"}, "content"),
        ("write_file", {"path": ["a"], "content": "x"}, "path"),
        ("read_file", {}, "path"),
        ("read_file", {"path": "a", "mode": "rb"}, "mode"),
        ("list_files", {"path": 7}, "path"),
    ]:
        out = await error(client, name, arguments)
        assert f"`{named}`" in out, f"{name} {arguments}: {out!r} does not name {named}"


async def stdio(brig, data_dir, store):
    params = StdioServerParameters(command=brig, args=["mcp", "--data-dir", data_dir, "--store", store])
    async with Client(params, read_timeout_seconds=120) as client:
        await exercise(client)


async def stdio_daemon(brig, url, key):
    params = StdioServerParameters(command=brig, args=["mcp"], env={"BRIG_URL": url, "BRIG_API_KEY": key})
    async with Client(params, read_timeout_seconds=120) as client:
        await client.list_tools()
        assert sessions(url, key) == []
        await exercise(client)
        assert len(sessions(url, key)) == 1
    # `brig mcp` deletes the sandbox before it exits, and the client waited for it.
    assert sessions(url, key) == []


def sessions(url, key):
    response = httpx2.get(
        url + "/v1/sessions",
        params={"metadata": "frontend=mcp"},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return response.json()["sessions"]


async def http(url, key):
    assert sessions(url, key) == []
    async with http_client(url, key) as client:
        # The sandbox is made on the first tool call, not before.
        await client.list_tools()
        assert sessions(url, key) == []
        await exercise(client)
        live = sessions(url, key)
        assert len(live) == 1, live
    # The client ended its MCP session (DELETE): the sandbox goes with it.
    deadline = time.monotonic() + 60
    while sessions(url, key):
        assert time.monotonic() < deadline, f"still live: {sessions(url, key)}"
        await asyncio.sleep(0.2)
    audit = httpx2.get(
        url + "/v1/audit",
        params={"session_id": live[0]["session_id"]},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert audit.status_code == 200, audit.text
    events = audit.json()["events"]
    actions = {e["action"] for e in events}
    assert {"session.create", "exec", "file.write", "session.delete"} <= actions, actions
    assert {e["frontend"] for e in events} == {"mcp"}, events


async def expiry(url, key):
    async with http_client(url, key, terminate_on_close=False) as client:
        await ok(client, "write_file", {"path": "a.txt", "content": "a"})
        assert len(sessions(url, key)) == 1
    # No DELETE was sent: the session is deleted once it has idled past the daemon's
    # --mcp-idle-timeout (the test gives it 1 s).
    deadline = time.monotonic() + 60
    while sessions(url, key):
        assert time.monotonic() < deadline, f"still live: {sessions(url, key)}"
        await asyncio.sleep(0.2)


async def recreate(url, key):
    async with http_client(url, key) as client:
        await ok(client, "write_file", {"path": "a.txt", "content": "a"})
        [live] = sessions(url, key)
        # Gone under the MCP session's feet, as its TTL or idle timeout would do.
        gone = httpx2.delete(
            url + "/v1/sessions/" + live["session_id"], headers={"Authorization": f"Bearer {key}"}, timeout=60
        )
        assert gone.status_code == 204, gone.text
        assert "gone" in await error(client, "list_files", {})
        assert "a.txt" not in await ok(client, "list_files", {})
        [new] = sessions(url, key)
        assert new["session_id"] != live["session_id"]


async def nokey(url):
    for headers in [{}, {"Authorization": "Bearer brig_not_a_key"}]:
        response = httpx2.post(
            url + "/mcp",
            headers={**headers, "Accept": "application/json, text/event-stream"},
            json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "t", "version": "0"}}},
            timeout=30,
        )
        assert response.status_code == 401, (headers, response.status_code, response.text)
        assert response.json()["error"]["code"] == "unauthorized", response.text
    # And the client itself gets nowhere.
    try:
        async with http_client(url, None) as client:
            await client.list_tools()
    except BaseException:  # noqa: BLE001 - any failure to connect will do
        return
    raise AssertionError("the MCP client connected without a key")


async def containment(url, key, hostfile):
    with open(hostfile) as f:
        secret = f.read().strip()
    assert secret
    async with http_client(url, key) as client:
        depth = "../" * 12
        for path in [depth + hostfile.lstrip("/"), "/workspace/" + depth + hostfile.lstrip("/")]:
            result = await call(client, "read_file", {"path": path})
            assert secret not in text(result), f"read_file {path} read the host's file"
        # A symlink planted from inside, to the host file, and to a directory above it.
        await ok(client, "run_command", {"command": f"ln -s {hostfile} link && ln -s / root && ln -s ../../../.. up"})
        for path in ["link", "root" + hostfile, "up" + hostfile]:
            result = await call(client, "read_file", {"path": path})
            assert secret not in text(result), f"read_file {path} read the host's file"
            result = await call(client, "list_files", {"path": path.rsplit("/", 1)[0] if "/" in path else path})
            assert secret not in text(result)


async def isolation(url, key):
    async with http_client(url, key) as a, http_client(url, key) as b:
        await ok(a, "write_file", {"path": "secret.txt", "content": "only-for-a"})
        await ok(b, "write_file", {"path": "mine.txt", "content": "b"})
        out = await error(b, "read_file", {"path": "secret.txt"})
        assert "only-for-a" not in out, out
        assert "secret.txt" not in await ok(b, "list_files", {})
        out = await ok(b, "run_command", {"command": "cat /workspace/secret.txt; ls -a /workspace /tmp"})
        assert "only-for-a" not in out and "secret.txt" in out and "No such file" in out, out
        assert "mine.txt" not in await ok(a, "list_files", {})
        assert len(sessions(url, key)) == 2


def main():
    mode, args = sys.argv[1], sys.argv[2:]
    runs = {"stdio": stdio, "stdio-daemon": stdio_daemon, "http": http, "nokey": nokey, "expiry": expiry, "recreate": recreate, "containment": containment, "isolation": isolation}
    asyncio.run(runs[mode](*args))
    print("ok")


if __name__ == "__main__":
    main()
