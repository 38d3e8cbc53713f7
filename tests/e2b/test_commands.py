"""E2B's SDK (unchanged) running commands through brig's envd."""

import time

import pytest
from e2b import CommandExitException, NotFoundException, Sandbox


def home(sandbox: Sandbox) -> str:
    return sandbox.commands.run("pwd").stdout.strip()


def test_run_streams_stdout_and_stderr_to_callbacks(sandbox: Sandbox):
    out, err = [], []
    result = sandbox.commands.run(
        "echo one; sleep 0.2; echo two >&2; echo three",
        on_stdout=out.append,
        on_stderr=err.append,
    )
    assert result.exit_code == 0
    assert result.stdout == "one\nthree\n"
    assert result.stderr == "two\n"
    assert "".join(out) == "one\nthree\n"
    assert "".join(err) == "two\n"
    assert result.error is None


def test_a_failing_command_raises_with_its_exit_code(sandbox: Sandbox):
    with pytest.raises(CommandExitException) as raised:
        sandbox.commands.run("echo partial; echo bad >&2; exit 7")
    assert raised.value.exit_code == 7
    assert raised.value.stdout == "partial\n"
    assert raised.value.stderr == "bad\n"


def test_commands_start_in_the_home_with_envs_and_cwd(sandbox: Sandbox):
    assert sandbox.commands.run("echo $HOME").stdout.strip() == home(sandbox)
    assert sandbox.commands.run("echo $FOO", envs={"FOO": "bar"}).stdout == "bar\n"
    # Scoped to the one command.
    assert sandbox.commands.run("echo -n $FOO").stdout == ""
    assert sandbox.commands.run("pwd", cwd="/tmp").stdout == "/tmp\n"
    sandbox.files.make_dir("sub/dir")
    assert sandbox.commands.run("pwd", cwd="sub/dir").stdout.strip() == f"{home(sandbox)}/sub/dir"
    sandbox.files.remove("sub")


def test_stdin_is_closed_unless_asked_for(sandbox: Sandbox):
    started = time.monotonic()
    assert sandbox.commands.run("cat; echo done").stdout == "done\n"
    assert time.monotonic() - started < 30


def test_background_commands_are_listed_and_killed(sandbox: Sandbox):
    first = sandbox.commands.run("sleep 600", background=True)
    second = sandbox.commands.run("sleep 600", background=True)
    pids = [p.pid for p in sandbox.commands.list()]
    assert first.pid in pids and second.pid in pids
    listed = next(p for p in sandbox.commands.list() if p.pid == first.pid)
    assert listed.cmd == "/bin/bash"
    assert listed.args == ["-l", "-c", "sleep 600"]

    # The pid is the process's own in the sandbox.
    sandbox.commands.run(f"kill -0 {first.pid}")
    assert sandbox.commands.kill(first.pid) is True
    with pytest.raises(CommandExitException) as raised:
        first.wait()
    assert raised.value.exit_code == -1
    assert "killed" in raised.value.error
    assert first.pid not in [p.pid for p in sandbox.commands.list()]
    with pytest.raises(CommandExitException):
        sandbox.commands.run(f"kill -0 {first.pid}")
    # A process that is gone is not found: kill says so.
    assert sandbox.commands.kill(first.pid) is False
    second.kill()
    with pytest.raises(CommandExitException):
        second.wait()


def test_send_stdin_and_close_it(sandbox: Sandbox):
    reader = sandbox.commands.run("read line; echo got $line", background=True, stdin=True)
    sandbox.commands.send_stdin(reader.pid, "hello\n")
    assert reader.wait().stdout == "got hello\n"

    cat = sandbox.commands.run("cat", background=True, stdin=True)
    cat.send_stdin(b"bytes ")
    sandbox.commands.send_stdin(cat.pid, "and text")
    sandbox.commands.close_stdin(cat.pid)
    assert cat.wait().stdout == "bytes and text"


def test_output_that_is_not_utf8_reads_as_replacement_characters(sandbox: Sandbox):
    result = sandbox.commands.run(r"printf 'ok\xff\xe2'")
    assert result.stdout == "ok\ufffd\ufffd"


def test_connect_to_a_running_command(sandbox: Sandbox):
    handle = sandbox.commands.run("sleep 0.5; echo late", background=True)
    attached = sandbox.commands.connect(handle.pid)
    assert attached.pid == handle.pid
    assert attached.wait().stdout == "late\n"
    with pytest.raises(NotFoundException):
        sandbox.commands.connect(999999)
