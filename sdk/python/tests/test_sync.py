"""The synchronous client, end to end against a live daemon."""

import base64
import io
import os
import threading

import pytest

from brig import (
    AuthenticationError,
    BrigError,
    CommandHandle,
    FilesystemError,
    InvalidRequestError,
    NotFoundError,
    Sandbox,
)
from brig import TimeoutError as BrigTimeoutError


@pytest.fixture
def sbx():
    with Sandbox.create(timeout=600) as s:
        yield s


def test_create_connect_list_and_kill():
    label = {"test": f"sync-{os.getpid()}"}
    with Sandbox.create(timeout=300, env={"GREETING": "hi"}, metadata=label) as s:
        assert s.get_info().metadata == label
        assert [i.sandbox_id for i in Sandbox.list(metadata=label)] == [s.sandbox_id]
        other = Sandbox.connect(s.sandbox_id)
        assert other.commands.run("echo $GREETING").stdout == "hi\n"
        other.close()
        assert s.is_running()
    # The context manager killed it.
    assert Sandbox.list(metadata=label) == []
    with pytest.raises(NotFoundError) as err:
        Sandbox.connect(s.sandbox_id)
    assert (err.value.code, err.value.status) == ("not_found", 404)
    assert s.kill() is False


def test_commands_foreground(sbx):
    r = sbx.commands.run("echo out; echo err >&2; exit 3")
    assert (r.exit_code, r.stdout, r.stderr, r.ok) == (3, "out\n", "err\n", False)
    assert sbx.commands.run(["printf", "%s", "a b"]).stdout == "a b"
    assert sbx.commands.run("pwd", cwd="/tmp").stdout == "/tmp\n"
    assert sbx.commands.run("echo $X", env={"X": "y"}).stdout == "y\n"
    assert sbx.commands.run("cat", stdin="piped").stdout == "piped"

    seen = {"stdout": [], "stderr": []}
    r = sbx.commands.run(
        "for i in 1 2 3; do echo $i; done; echo oops >&2",
        on_stdout=seen["stdout"].append,
        on_stderr=seen["stderr"].append,
    )
    assert "".join(seen["stdout"]) == "1\n2\n3\n" == r.stdout
    assert "".join(seen["stderr"]) == "oops\n" == r.stderr
    assert r.exit_code == 0

    r = sbx.commands.run("sleep 60", timeout=0.5)
    assert r.timed_out and r.exit_code is None


def test_commands_background(sbx):
    h = sbx.commands.run("read line; echo got $line; echo done >&2", background=True)
    assert isinstance(h, CommandHandle)
    assert h.info().state == "running"
    assert h.pid in [p.pid for p in sbx.commands.list()]
    h.send_stdin("hello\n")
    seen = []
    r = h.wait(timeout=60, on_stdout=seen.append)
    assert (r.exit_code, r.stdout, r.stderr) == (0, "got hello\n", "done\n")
    assert "".join(seen) == "got hello\n"
    assert h.output() == "got hello\n"

    sleeper = sbx.commands.run("sleep 600", background=True)
    with pytest.raises(BrigTimeoutError):
        sleeper.wait(timeout=0.2)
    sleeper.kill()
    r = sleeper.wait(timeout=60)
    assert r.signal == 9 and r.exit_code is None
    assert sbx.commands.connect(sleeper.pid).info().state == "exited"


def test_files(sbx, tmp_path):
    f = sbx.files
    assert f.write("/workspace/deep/dir/hello.txt", "héllo").size == len("héllo".encode())
    assert f.read("/workspace/deep/dir/hello.txt") == "héllo"
    blob = bytes(range(256)) * 8192  # 2 MiB, every byte value
    f.write("/tmp/blob", io.BytesIO(blob))
    assert f.read("/tmp/blob", format="bytes") == blob
    assert b"".join(f.read("/tmp/blob", format="stream")) == blob
    f.write("/tmp/chunks", (bytes([i]) * 1000 for i in range(10)))
    assert len(f.read("/tmp/chunks", format="bytes")) == 10_000

    f.make_dir("/workspace/empty/sub")
    names = {e.name: e for e in f.list("/workspace")}
    assert names["deep"].is_dir and names["empty"].is_dir
    assert f.exists("/workspace/deep/dir/hello.txt")
    assert not f.exists("/workspace/nope")

    with pytest.raises(FilesystemError) as err:
        f.remove("/workspace/deep")
    assert err.value.code == "not_empty"
    f.remove("/workspace/deep", recursive=True)
    with pytest.raises(NotFoundError) as err:
        f.read("/workspace/deep/dir/hello.txt")
    assert (err.value.code, err.value.status) == ("no_such_file", 404)

    # A directory up and back down, through the archive endpoints.
    src = tmp_path / "src"
    (src / "a" / "b").mkdir(parents=True)
    (src / "top.txt").write_text("top")
    (src / "a" / "b" / "leaf.bin").write_bytes(b"\x00\x01" * 50_000)
    assert f.upload_dir(str(src), "/workspace/project") >= 4
    assert f.read("/workspace/project/a/b/leaf.bin", format="bytes") == b"\x00\x01" * 50_000
    assert sbx.commands.run("cat /workspace/project/top.txt").stdout == "top"
    dst = tmp_path / "dst"
    f.download_dir("/workspace/project", str(dst))
    assert (dst / "top.txt").read_text() == "top"
    assert (dst / "a" / "b" / "leaf.bin").read_bytes() == b"\x00\x01" * 50_000


def test_run_code_keeps_state_and_contexts(sbx):
    out = []
    ex = sbx.run_code("x = 40\nprint('side')\nx + 2", on_stdout=out.append)
    assert ex.text == "42" and ex.stdout == "side\n" == "".join(out)
    assert ex.error is None and ex.context_id == "default"
    assert sbx.run_code("x += 1; x").text == "41"

    ctx = sbx.create_code_context(cwd="/tmp")
    assert sbx.run_code("import os; os.getcwd()", context=ctx).text == "'/tmp'"
    assert sbx.run_code("'x' in globals()", context=ctx).text == "False"
    sbx.run_code("y = 5", context=ctx.id)
    assert {c.id for c in sbx.list_code_contexts()} == {"default", ctx.id}
    assert sbx.restart_code_context(ctx).execution_count == 0
    assert sbx.run_code("'y' in globals()", context=ctx).text == "False"
    sbx.remove_code_context(ctx)
    with pytest.raises(NotFoundError) as err:
        sbx.run_code("1", context=ctx)
    assert err.value.status == 404


def test_run_code_errors_and_timeout(sbx):
    errors = []
    ex = sbx.run_code("def f():\n    raise ValueError('bad')\nf()", on_error=errors.append)
    assert ex.error is not None and errors == [ex.error]
    assert (ex.error.name, ex.error.value) == ("ValueError", "bad")
    assert "f()" in ex.error.traceback

    sbx.run_code("kept = 'yes'")
    ex = sbx.run_code("import time; time.sleep(600)", timeout=1)
    assert ex.timed_out and ex.error.name == "KeyboardInterrupt"
    assert sbx.run_code("kept").text == "'yes'"

    with pytest.raises(InvalidRequestError) as err:
        sbx.run_code("#" * (1024 * 1024 + 1))
    assert (err.value.code, err.value.status) == ("payload_too_large", 413)

    # A kernel that dies is reported as such; the next call gets a fresh one.
    ex = sbx.run_code("import os; os._exit(1)")
    assert ex.error is not None and ex.error.name == "KernelDied"
    assert sbx.run_code("'kept' in globals()").text == "False"


def test_run_code_rich_results(sbx):
    results = []
    ex = sbx.run_code(
        "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3], [1, 4, 9], label='sq')\nplt.title('squares')",
        on_result=results.append,
    )
    assert ex.error is None, ex.error
    charts = [r for r in ex.results if r.png]
    assert len(charts) == 1 and results == ex.results
    assert base64.b64decode(charts[0].png).startswith(b"\x89PNG")
    assert charts[0].chart["axes"][0]["title"] == "squares"

    ex = sbx.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})")
    main = ex.results[-1]
    assert main.is_main_result and "<table" in main.html and "a" in main.text
    assert "text/html" in main.formats()


def test_concurrent_calls_into_two_contexts(sbx):
    a, b = sbx.create_code_context(), sbx.create_code_context()
    answers = {}

    def run(ctx, n):
        answers[ctx.id] = sbx.run_code(f"import time; time.sleep(0.5); {n}", context=ctx).text

    threads = [threading.Thread(target=run, args=(c, n)) for c, n in ((a, 1), (b, 2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert answers == {a.id: "1", b.id: "2"}


def test_snapshot_and_fork(sbx):
    sbx.files.write("/workspace/state.txt", "before")
    snap = sbx.snapshot(name="sdk-test")
    assert snap.sandbox_id == sbx.sandbox_id
    try:
        sbx.files.write("/workspace/state.txt", "after")
        with Sandbox.create(snapshot=snap, timeout=300) as fork:
            assert fork.get_info().snapshot == snap.snapshot_id
            assert fork.files.read("/workspace/state.txt") == "before"
            fork.files.write("/workspace/state.txt", "fork")
        assert sbx.files.read("/workspace/state.txt") == "after"
        sbx.restore(snap)
        assert sbx.files.read("/workspace/state.txt") == "before"
    finally:
        sbx.delete_snapshot(snap)


def test_errors_carry_the_daemons_code():
    with pytest.raises(AuthenticationError) as err:
        Sandbox.list(api_key="brig_not-a-key")
    assert (err.value.code, err.value.status) == ("unauthorized", 401)

    with pytest.raises(InvalidRequestError) as err:
        Sandbox.create(metadata={"bad key!": "v"})
    assert (err.value.code, err.value.status) == ("invalid_request", 422)
    assert isinstance(err.value, BrigError) and err.value.message

    with pytest.raises(NotFoundError) as err:
        Sandbox.connect("ses_000000000000000000000000")
    assert err.value.code == "not_found"

    with pytest.raises(NotFoundError):
        Sandbox.create(snapshot="snap_doesnotexist")
