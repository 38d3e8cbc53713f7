"""The asyncio client, end to end against a live daemon."""

import asyncio
import base64
import io
import os

import pytest

from brig import (
    AsyncCommandHandle,
    AsyncSandbox,
    AuthenticationError,
    FilesystemError,
    InvalidRequestError,
    NotFoundError,
)


async def test_lifecycle():
    label = {"test": f"async-{os.getpid()}"}
    async with await AsyncSandbox.create(timeout=300, metadata=label, env={"A": "b"}) as s:
        listed = await AsyncSandbox.list(metadata=label)
        assert [i.sandbox_id for i in listed] == [s.sandbox_id]
        other = await AsyncSandbox.connect(s.sandbox_id)
        assert (await other.commands.run("echo $A")).stdout == "b\n"
        await other.close()
    assert await AsyncSandbox.list(metadata=label) == []
    with pytest.raises(NotFoundError) as err:
        await AsyncSandbox.connect(s.sandbox_id)
    assert (err.value.code, err.value.status) == ("not_found", 404)


async def test_commands_with_async_callbacks():
    async with await AsyncSandbox.create(timeout=300) as s:
        seen = []

        async def on_stdout(text):
            await asyncio.sleep(0)
            seen.append(text)

        r = await s.commands.run("echo one; echo two; exit 4", on_stdout=on_stdout)
        assert (r.exit_code, r.stdout) == (4, "one\ntwo\n")
        assert "".join(seen) == "one\ntwo\n"
        assert (await s.commands.run("sleep 60", timeout=0.5)).timed_out

        h = await s.commands.run("read l; echo [$l]", background=True)
        assert isinstance(h, AsyncCommandHandle)
        await h.send_stdin("in\n", close=True)
        r = await h.wait(timeout=60)
        assert (r.exit_code, r.stdout) == (0, "[in]\n")

        sleeper = await s.commands.run("sleep 600", background=True)
        await sleeper.kill()
        assert (await sleeper.wait(timeout=60)).signal == 9


async def test_files(tmp_path):
    async with await AsyncSandbox.create(timeout=300) as s:
        f = s.files
        await f.write("/workspace/x/y.txt", "text")
        assert await f.read("/workspace/x/y.txt") == "text"
        blob = os.urandom(1 << 20)

        async def chunks():
            for i in range(0, len(blob), 100_000):
                yield blob[i : i + 100_000]

        assert (await f.write("/tmp/blob", chunks())).size == len(blob)
        assert await f.read("/tmp/blob", format="bytes") == blob
        got = b"".join([c async for c in await f.read("/tmp/blob", format="stream")])
        assert got == blob
        await f.write("/tmp/from-file", io.BytesIO(b"abc" * 100_000))
        assert await f.read("/tmp/from-file", format="bytes") == b"abc" * 100_000
        await f.make_dir("/workspace/d/e")
        assert {e.name for e in await f.list("/workspace")} >= {"x", "d"}
        with pytest.raises(FilesystemError) as err:
            await f.remove("/workspace/x")
        assert err.value.code == "not_empty"
        await f.remove("/workspace/x", recursive=True)
        assert not await f.exists("/workspace/x")
        with pytest.raises(NotFoundError) as err:
            await f.read("/workspace/x/y.txt")
        assert err.value.code == "no_such_file"

        src = tmp_path / "src"
        (src / "sub").mkdir(parents=True)
        (src / "sub" / "f").write_text("deep")
        await f.upload_dir(str(src), "/workspace/up")
        assert await f.read("/workspace/up/sub/f") == "deep"
        await f.download_dir("/workspace/up", str(tmp_path / "down"))
        assert (tmp_path / "down" / "sub" / "f").read_text() == "deep"


async def test_run_code():
    async with await AsyncSandbox.create(timeout=300) as s:
        assert (await s.run_code("n = 6")).error is None
        assert (await s.run_code("n * 7")).text == "42"
        ctx = await s.create_code_context()
        assert (await s.run_code("'n' in globals()", context=ctx)).text == "False"
        assert [c.id for c in await s.list_code_contexts()] != []
        await s.restart_code_context(ctx)
        await s.remove_code_context(ctx)
        with pytest.raises(NotFoundError):
            await s.run_code("1", context=ctx)

        ex = await s.run_code("1/0")
        assert ex.error.name == "ZeroDivisionError"
        ex = await s.run_code("import time; time.sleep(600)", timeout=1)
        assert ex.timed_out
        assert (await s.run_code("n")).text == "6"

        got = []
        ex = await s.run_code(
            "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
            "plt.bar(['a', 'b'], [3, 5])",
            on_result=got.append,
        )
        png = [r for r in got if r.png]
        assert png and base64.b64decode(png[0].png).startswith(b"\x89PNG")
        assert png[0].chart["axes"][0]["elements"][0]["type"] == "bar"


async def test_snapshot_fork_and_errors():
    async with await AsyncSandbox.create(timeout=300) as s:
        await s.files.write("/workspace/f", "1")
        snap = await s.snapshot()
        try:
            async with await AsyncSandbox.create(snapshot=snap.snapshot_id) as fork:
                assert await fork.files.read("/workspace/f") == "1"
        finally:
            await s.delete_snapshot(snap)
        with pytest.raises(NotFoundError):
            await AsyncSandbox.create(snapshot=snap)

    with pytest.raises(AuthenticationError) as err:
        await AsyncSandbox.list(api_key="brig_wrong")
    assert err.value.code == "unauthorized"
    with pytest.raises(InvalidRequestError) as err:
        await AsyncSandbox.create(network="sideways")
    assert err.value.code == "invalid_request" and err.value.status == 422
