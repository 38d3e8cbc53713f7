"""E2B's control plane through the unmodified e2b SDK: create, info, list (paged,
filtered), connect, timeout, pause and resume, snapshots, fork, kill; wrong keys,
unknown templates and another tenant's sandboxes refused."""

import datetime
import time

import pytest
from e2b import Sandbox, SandboxQuery, SandboxState
from e2b.exceptions import (
    AuthenticationException,
    NotFoundException,
    SandboxException,
    SandboxNotFoundException,
)


def ids(paginator):
    """Every sandbox id of every page, and how many pages there were."""
    found, pages = [], 0
    while paginator.has_next:
        found.extend(s.sandbox_id for s in paginator.next_items())
        pages += 1
    return found, pages


def test_create_and_get_info(sandbox, label):
    info = sandbox.get_info()
    assert info.sandbox_id == sandbox.sandbox_id
    assert info.template_id == "base"
    assert info.state == SandboxState.RUNNING
    assert info.metadata == {"suite": label}
    assert info.envd_version
    life = (info.end_at - info.started_at).total_seconds()
    assert 290 <= life <= 310, life
    # The class method says the same.
    assert Sandbox.get_info(sandbox.sandbox_id).sandbox_id == sandbox.sandbox_id


def test_the_code_interpreter_template_exists(sandboxes):
    sandbox = sandboxes(template="code-interpreter-v1")
    assert sandbox.get_info().template_id == "code-interpreter-v1"


def test_list_pages_and_filters_by_metadata(sandboxes, label):
    made = {sandboxes(metadata={"odd": "yes & no = maybe" if i % 2 else "no"}).sandbox_id for i in range(3)}
    found, pages = ids(Sandbox.list(query=SandboxQuery(metadata={"suite": label}), limit=2))
    assert sorted(found) == sorted(made)
    assert pages == 2
    odd, _ = ids(
        Sandbox.list(query=SandboxQuery(metadata={"suite": label, "odd": "yes & no = maybe"}))
    )
    assert len(odd) == 1 and odd[0] in made


def test_list_by_start_and_template(sandboxes, label):
    before = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=5)
    base = sandboxes()
    other = sandboxes(template="code-interpreter-v1")
    query = lambda **q: SandboxQuery(metadata={"suite": label}, **q)
    assert sorted(ids(Sandbox.list(query=query(started_after=before)))[0]) == sorted(
        [base.sandbox_id, other.sandbox_id]
    )
    later = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=5)
    assert ids(Sandbox.list(query=query(started_after=later)))[0] == []
    assert ids(Sandbox.list(query=query(template="code-interpreter-v1")))[0] == [other.sandbox_id]


def test_list_by_state(sandboxes, label):
    running, paused = sandboxes(), sandboxes()
    assert paused.pause()
    query = lambda *states: SandboxQuery(metadata={"suite": label}, state=list(states))
    assert ids(Sandbox.list(query=query(SandboxState.PAUSED)))[0] == [paused.sandbox_id]
    assert ids(Sandbox.list(query=query(SandboxState.RUNNING)))[0] == [running.sandbox_id]
    assert len(ids(Sandbox.list(query=query()))[0]) == 2


def test_connect(sandbox):
    again = Sandbox.connect(sandbox.sandbox_id)
    assert again.sandbox_id == sandbox.sandbox_id
    assert again.get_info().state == SandboxState.RUNNING


def test_set_timeout(sandbox):
    sandbox.set_timeout(1000)
    info = sandbox.get_info()
    assert (info.end_at - datetime.datetime.now(datetime.timezone.utc)).total_seconds() > 900
    Sandbox.set_timeout(sandbox.sandbox_id, 30)
    info = sandbox.get_info()
    assert (info.end_at - datetime.datetime.now(datetime.timezone.utc)).total_seconds() < 60


def test_a_timeout_of_zero_ends_the_sandbox_now(sandboxes):
    sandbox = sandboxes()
    sandbox.set_timeout(0)
    with pytest.raises(SandboxNotFoundException):
        sandbox.get_info()


def test_pause_and_resume_by_connecting(sandbox):
    assert sandbox.pause() is True
    info = sandbox.get_info()
    assert info.state == SandboxState.PAUSED
    # Its timeout stops while it is paused.
    assert (info.end_at - info.started_at).days >= 29
    # Paused already: the SDK reads E2B's 409 as False.
    assert sandbox.pause() is False
    resumed = Sandbox.connect(sandbox.sandbox_id, timeout=120)
    info = resumed.get_info()
    assert info.state == SandboxState.RUNNING
    now = datetime.datetime.now(datetime.timezone.utc)
    assert 60 < (info.end_at - now).total_seconds() <= 121


def test_auto_pause_pauses_at_the_timeout(sandboxes):
    sandbox = sandboxes(timeout=1, lifecycle={"on_timeout": "pause"})
    for _ in range(300):
        info = sandbox.get_info()
        if info.state == SandboxState.PAUSED:
            break
        time.sleep(0.1)
    assert info.state == SandboxState.PAUSED
    assert info.lifecycle["on_timeout"] == "pause"
    resumed = Sandbox.connect(sandbox.sandbox_id, timeout=60)
    assert resumed.get_info().state == SandboxState.RUNNING


def test_kill_then_gone(sandboxes):
    sandbox = sandboxes()
    sandbox.kill()
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(sandbox.sandbox_id)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(sandbox.sandbox_id)
    assert Sandbox.kill(sandbox.sandbox_id) is False


def test_a_wrong_api_key_is_refused():
    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key="not-a-brig-key")
    with pytest.raises(AuthenticationException):
        Sandbox.list(api_key="not-a-brig-key").next_items()


def test_an_unknown_template_is_refused():
    with pytest.raises(SandboxException, match="template 'no-such-template' not found"):
        Sandbox.create(template="no-such-template")


def test_another_tenants_sandboxes_are_out_of_sight(sandbox, other_api_key, label):
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(sandbox.sandbox_id, api_key=other_api_key)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(sandbox.sandbox_id, api_key=other_api_key)
    assert Sandbox.kill(sandbox.sandbox_id, api_key=other_api_key) is False
    query = SandboxQuery(metadata={"suite": label})
    assert ids(Sandbox.list(query=query, api_key=other_api_key))[0] == []
    assert sandbox.get_info().state == SandboxState.RUNNING


def test_snapshots_are_templates(sandboxes, sandbox):
    snapshot = sandbox.create_snapshot()
    try:
        assert snapshot.snapshot_id
        listed = [s.snapshot_id for s in Sandbox.list_snapshots(sandbox_id=sandbox.sandbox_id).next_items()]
        assert snapshot.snapshot_id in listed
        started = sandboxes(template=snapshot.snapshot_id)
        assert started.get_info().template_id == snapshot.snapshot_id
    finally:
        assert Sandbox.delete_snapshot(snapshot.snapshot_id) is True
    assert Sandbox.delete_snapshot(snapshot.snapshot_id) is False


def test_fork(sandbox, label):
    forks = sandbox.fork(count=2, timeout=120)
    try:
        assert len(forks) == 2
        for fork in forks:
            assert isinstance(fork, Sandbox), fork
            assert fork.sandbox_id != sandbox.sandbox_id
            assert fork.get_info().metadata == {"suite": label}
    finally:
        for fork in forks:
            if isinstance(fork, Sandbox):
                fork.kill()
    assert Sandbox.list_snapshots(sandbox_id=sandbox.sandbox_id).next_items() == []


def test_a_sandbox_runs_as_user_in_its_home(sandboxes):
    sandbox = sandboxes(envs={"GREETING": "hi"})
    assert sandbox.is_running()
    result = sandbox.commands.run('echo "$GREETING $HOME $USER"; pwd; whoami')
    assert result.stdout.split("\n")[:3] == ["hi /home/user user", "/home/user", "user"]


def test_two_sandboxes_are_isolated_from_each_other(sandboxes):
    one, two = sandboxes(), sandboxes()
    one.files.write("/home/user/secret.txt", "only in one")
    assert one.files.read("/home/user/secret.txt") == "only in one"
    assert not two.files.exists("/home/user/secret.txt")
    assert two.commands.run("ls /home/user").stdout.strip() == ""
    # Another sandbox's processes are not visible either.
    one.commands.run("sleep 300", background=True)
    # Every process's command line, from /proc (images need not have ps).
    listing = "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '"
    assert "sleep 300" in one.commands.run(listing).stdout
    assert "sleep 300" not in two.commands.run(listing).stdout


def test_a_snapshot_keeps_the_files(sandboxes, sandbox):
    sandbox.files.write("kept.txt", "still here")
    snapshot = sandbox.create_snapshot()
    try:
        started = sandboxes(template=snapshot.snapshot_id)
        assert started.files.read("/home/user/kept.txt") == "still here"
    finally:
        Sandbox.delete_snapshot(snapshot.snapshot_id)


def test_a_killed_sandbox_is_not_running(sandboxes):
    sandbox = sandboxes()
    assert sandbox.is_running()
    sandbox.kill()
    assert not sandbox.is_running()


def test_files_survive_a_pause(sandbox):
    sandbox.files.write("/home/user/before.txt", "paused")
    assert sandbox.pause()
    resumed = Sandbox.connect(sandbox.sandbox_id)
    assert resumed.files.read("/home/user/before.txt") == "paused"


def test_metrics_are_refused_not_made_up(sandbox):
    with pytest.raises(SandboxException, match="501"):
        sandbox.get_metrics()


def test_not_found_is_e2bs(sandbox):
    with pytest.raises(NotFoundException):
        Sandbox.get_info("ses_000000000000000000000000")


def test_network_fields_become_the_sandboxs_egress_policy(sandboxes):
    allowed = sandboxes(network={"allow_out": ["example.com"], "deny_out": ["0.0.0.0/0"]})
    info = allowed.get_info()
    assert info.network == {"allow_out": ["example.com"], "deny_out": ["0.0.0.0/0"]}
    closed = sandboxes(allow_internet_access=False)
    assert closed.get_info().allow_internet_access is False
    opened = sandboxes(allow_internet_access=True)
    assert opened.get_info().allow_internet_access is True
    # Changed later: from now on, this address is denied.
    opened.update_network({"deny_out": ["192.0.2.1"]})
    assert opened.get_info().network == {"allow_out": [], "deny_out": ["192.0.2.1"]}


def test_network_fields_brig_cannot_honour_are_refused(label):
    with pytest.raises(SandboxException, match="maskRequestHost"):
        Sandbox.create(metadata={"suite": label}, network={"mask_request_host": "x.example"})
    with pytest.raises(SandboxException, match="allowOut"):
        Sandbox.create(
            metadata={"suite": label},
            network={"allow_out": ["192.0.2.1"], "deny_out": ["192.0.2.0/24"]},
        )


def test_a_paused_sandbox_is_not_running_until_connected(sandbox):
    assert sandbox.is_running()
    assert sandbox.pause()
    assert not sandbox.is_running()
    assert Sandbox.connect(sandbox.sandbox_id).is_running()
