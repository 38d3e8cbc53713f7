"""onyx's own client of its code interpreter (`CodeInterpreterClient`, vendored
unchanged in `client/`) against brig: at `/onyx` it finds python-sandbox's whole API
and turns on its session and bash tools; at the root, where `/health` reports brig's
version and `/v1/sessions` is brig's, it keeps them off, as it does for any server
older than 0.4.0, and still runs code. The calls are those onyx's tools make
(`BashTool.is_available`, `coding_agent`'s session around a staged tarball).
"""

from __future__ import annotations

import io
import os
import sys
import tarfile
import time

import pytest
import requests

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "client"))

from onyx.tools.tool_implementations.python.code_interpreter_client import (  # noqa: E402
    CodeInterpreterClient,
    CodeInterpreterVersionError,
)

SESSION_METHODS = (
    CodeInterpreterClient.create_session,
    CodeInterpreterClient.execute_bash_in_session,
    CodeInterpreterClient.delete_session,
)


def onyx_client() -> CodeInterpreterClient:
    return CodeInterpreterClient(os.environ["BRIG_URL"].rstrip("/") + "/onyx")


def test_at_onyx_the_bash_tool_is_available() -> None:
    with onyx_client() as client:
        health = client.health()
        assert health.healthy, health
        assert health.version == "0.4.4"
        assert client.supports(*SESSION_METHODS)


def test_at_the_root_sessions_stay_off_and_code_runs() -> None:
    with CodeInterpreterClient(os.environ["BRIG_URL"]) as client:
        health = client.health()
        assert health.healthy, health
        assert not client.supports(*SESSION_METHODS)
        with pytest.raises(CodeInterpreterVersionError):
            client.create_session(ttl_seconds=60)
        assert client.execute("print(6 * 7)").stdout == "42\n"


def repo_tarball() -> bytes:
    """A tarball as GitHub's: one top-level directory."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, text in [("README.md", b"# demo\n"), ("src/main.py", b"print('hi')\n")]:
            info = tarfile.TarInfo(f"demo-abc123/{name}")
            info.size = len(text)
            tar.addfile(info, io.BytesIO(text))
    return out.getvalue()


def test_a_coding_agent_session() -> None:
    with onyx_client() as client:
        file_id = client.upload_file(repo_tarball(), "repo.tar.gz")
        before = time.time()
        session = client.create_session(
            ttl_seconds=600, files=[{"path": "repo.tar.gz", "file_id": file_id}]
        )
        try:
            assert isinstance(session.expires_at, float)
            assert before + 590 <= session.expires_at <= time.time() + 610, session
            extract = client.execute_bash_in_session(
                session_id=session.session_id,
                cmd="tar -xzf repo.tar.gz --strip-components=1 && rm repo.tar.gz && ls",
                timeout_ms=60_000,
            )
            assert extract.exit_code == 0, extract
            assert extract.stdout.split() == ["README.md", "src"], extract
            # The session keeps its files and working directory between commands.
            client.execute_bash_in_session(session.session_id, "echo more >> README.md")
            again = client.execute_bash_in_session(session.session_id, "pwd; cat README.md")
            assert again.stdout == "/workspace\n# demo\nmore\n", again
            assert (again.stderr, again.exit_code, again.timed_out) == ("", 0, False)
            failed = client.execute_bash_in_session(session.session_id, "echo no >&2; exit 3")
            assert (failed.stderr, failed.exit_code) == ("no\n", 3), failed
            slow = client.execute_bash_in_session(session.session_id, "sleep 30", timeout_ms=500)
            assert slow.timed_out, slow
        finally:
            client.delete_session(session.session_id)
            client.delete_file(file_id)
        for call in (
            lambda: client.execute_bash_in_session(session.session_id, "true"),
            lambda: client.delete_session(session.session_id),
        ):
            with pytest.raises(requests.HTTPError) as gone:
                call()
            assert gone.value.response.status_code == 404
            assert gone.value.response.json() == {
                "detail": f"Session '{session.session_id}' not found"
            }


def test_at_onyx_code_runs_as_at_the_root() -> None:
    with onyx_client() as client:
        assert client.execute("print(6 * 7)").stdout == "42\n"
        events = list(client.execute_streaming("print('a')"))
        # The output may come in pieces.
        assert "".join(e.data for e in events[:-1]) == "a\n", events
        assert events[-1].exit_code == 0, events
