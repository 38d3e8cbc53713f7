"""E2B's SDK (unchanged) using a sandbox's files through brig's envd."""

import io

import pytest
from e2b import FileType, FilesystemEventType, NotFoundException, Sandbox


def home(sandbox: Sandbox) -> str:
    return sandbox.commands.run("pwd").stdout.strip()


def test_write_and_read_text_and_bytes(sandbox: Sandbox):
    info = sandbox.files.write("notes/hello.txt", "Hello, brig!")
    assert info.path == f"{home(sandbox)}/notes/hello.txt"
    assert info.name == "hello.txt"
    assert sandbox.files.read("notes/hello.txt") == "Hello, brig!"
    assert sandbox.commands.run("cat notes/hello.txt").stdout == "Hello, brig!"

    data = bytes(range(256)) * 64
    sandbox.files.write("/tmp/blob.bin", data)
    assert bytes(sandbox.files.read("/tmp/blob.bin", format="bytes")) == data
    streamed = b"".join(sandbox.files.read("/tmp/blob.bin", format="stream"))
    assert streamed == data

    # Several at once, a stream, a gzip-encoded upload.
    written = sandbox.files.write_files(
        [{"path": "/tmp/many/a", "data": "one"}, {"path": "/tmp/many/b", "data": b"two"}]
    )
    assert [w.path for w in written] == ["/tmp/many/a", "/tmp/many/b"]
    sandbox.files.write("/tmp/many/c", io.BytesIO(b"streamed"))
    sandbox.files.write("/tmp/many/d", "zipped", gzip=True)
    assert [sandbox.files.read(f"/tmp/many/{n}") for n in "abcd"] == [
        "one",
        "two",
        "streamed",
        "zipped",
    ]
    sandbox.files.remove("notes")
    sandbox.files.remove("/tmp/many")


def test_list_exists_make_dir_rename_remove(sandbox: Sandbox):
    base = home(sandbox)
    assert sandbox.files.make_dir("tree/sub") is True
    assert sandbox.files.make_dir("tree/sub") is False
    sandbox.files.write("tree/file.txt", "x")
    entries = sandbox.files.list("tree")
    assert [(e.name, e.type, e.path) for e in entries] == [
        ("file.txt", FileType.FILE, f"{base}/tree/file.txt"),
        ("sub", FileType.DIR, f"{base}/tree/sub"),
    ]
    sandbox.files.write("tree/sub/deep.txt", "y")
    assert len(sandbox.files.list("tree", depth=1)) == 2
    assert len(sandbox.files.list("tree", depth=2)) == 3

    assert sandbox.files.exists("tree/file.txt")
    assert not sandbox.files.exists("tree/nothing")

    moved = sandbox.files.rename("tree/file.txt", "tree/sub/moved.txt")
    assert moved.path == f"{base}/tree/sub/moved.txt"
    assert not sandbox.files.exists("tree/file.txt")
    assert sandbox.files.read("tree/sub/moved.txt") == "x"

    sandbox.files.remove("tree")
    assert not sandbox.files.exists("tree")
    # Removing what is not there is no error, as in envd.
    sandbox.files.remove("tree")


def test_get_info(sandbox: Sandbox):
    sandbox.files.write("info.txt", "test")
    info = sandbox.files.get_info("info.txt")
    assert info.name == "info.txt"
    assert info.type == FileType.FILE
    assert info.path == f"{home(sandbox)}/info.txt"
    assert info.size == 4
    assert info.mode == 0o644
    assert info.permissions == "-rw-r--r--"
    assert info.owner == "user"
    assert info.modified_time is not None and info.modified_time.tzinfo is not None

    sandbox.commands.run("ln -s info.txt link.txt")
    link = sandbox.files.get_info("link.txt")
    assert link.type == FileType.FILE
    # The target resolved, as envd gives it: on the host's dirs the home is a link
    # to the workspace, so the real path is there.
    real_home = sandbox.commands.run("realpath ~").stdout.strip()
    assert link.symlink_target == f"{real_home}/info.txt"
    sandbox.files.remove("link.txt")
    sandbox.files.remove("info.txt")


def test_a_missing_file_raises_not_found(sandbox: Sandbox):
    with pytest.raises(NotFoundException):
        sandbox.files.read("does/not/exist.txt")
    with pytest.raises(NotFoundException):
        sandbox.files.get_info("does/not/exist.txt")
    with pytest.raises(NotFoundException):
        sandbox.files.list("does/not/exist")


def test_watch_dir_reports_changes_since_it_last_looked(sandbox: Sandbox):
    sandbox.files.make_dir("watched/sub")
    handle = sandbox.files.watch_dir("watched", recursive=True)
    sandbox.files.write("watched/sub/new.txt", "content")
    events = handle.get_new_events()
    assert (FilesystemEventType.CREATE, "sub/new.txt") in [(e.type, e.name) for e in events]
    sandbox.files.remove("watched/sub/new.txt")
    events = handle.get_new_events()
    assert [(e.type, e.name) for e in events] == [(FilesystemEventType.REMOVE, "sub/new.txt")]
    handle.stop()
    sandbox.files.remove("watched")
    with pytest.raises(NotFoundException):
        sandbox.files.watch_dir("watched")
