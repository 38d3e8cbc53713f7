#!/usr/bin/env python3
"""Soak `brig serve` with mixed work under CPU pressure, checking every answer.

    soak.py URL KEY SESSIONS SECONDS [HOGS [churn|volumes]]

SESSIONS client threads, one session each, loop over: an exec with stdin, an exec
streamed over SSE, a file uploaded and read back, a background process waited for
and its output read, an exec with 300 KB of output; every 4th round also a
directory uploaded and downloaded as tar and a one-shot /v1/execute; every 8th a
snapshot, a fork from it, a restore to it, and a pause and resume. With `churn`, each thread
instead creates a session (every other one with its own limits, so not from a warm
pool), runs one exec in it and deletes it, over and over; afterwards no session
may be left. With `volumes`, the same with every session mounting one of three
shared volumes (made on first use, root only) and appending a line to its thread's
file there; afterwards every line must be there, no session may hold a volume, and
the volumes are deleted. HOGS busy processes (default 2)
compete for the CPU meanwhile, so that the daemon is starved as a loaded host would
starve it. Any answer that is not exactly what the command must produce is an
error. Prints one JSON object; exits 1 if there was any error.

Written after the 100-session exec load found output lost under CPU starvation
(BENCHMARKS.md, session 16): the benchmark checks only `echo`; this checks the other
paths the same way.
"""

import http.client
import io
import json
import multiprocessing
import os
import sys
import tarfile
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon_load import Client  # noqa: E402


def hog(deadline):
    while time.time() < deadline:
        pass


def raw(client, method, path, body=None, headers=None):
    """One request with a raw body; returns (status, bytes)."""
    all_headers = {"Authorization": f"Bearer {client.key}"}
    all_headers.update(headers or {})
    client.conn.request(method, path, body=body, headers=all_headers)
    response = client.conn.getresponse()
    return response.status, response.read()


def sse(url, key, path, body):
    """A streamed exec on its own connection: (stdout, stderr, exit event)."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
    conn.request("POST", path, body=json.dumps(body),
                 headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        raise RuntimeError(f"stream: {response.status} {response.read()[:200]!r}")
    out, err, last, event = [], [], None, None
    for line in response:
        line = line.decode().rstrip("\n")
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data = json.loads(line[5:])
            if event == "stdout":
                out.append(data["data"])
            elif event == "stderr":
                err.append(data["data"])
            elif event in ("exit", "error"):
                last = (event, data)
    conn.close()
    return "".join(out), "".join(err), last


def tar_of(files):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def files_of_tar(data):
    """The regular files in a tar, by path (a broken or cut tar is an error)."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            return {m.name.removeprefix("./"): tar.extractfile(m).read()
                    for m in tar.getmembers() if m.isfile()}
    except tarfile.TarError as e:
        return f"bad tar: {e}"


def worker(url, key, deadline, counts, errors, lock, index):
    client = Client(url, key)
    session = client.create()
    n = 0

    def check(what, ok, detail):
        if not ok:
            with lock:
                errors.append(f"{what}: {str(detail)[:300]}")

    try:
        while time.time() < deadline:
            n += 1
            base = f"/workspace/soak{index}_{n}"
            # 1. stdin in, stdout out.
            text = f"{index}-{n}-" + "x" * (n % 5000)
            r = client.call("POST", f"/v1/sessions/{session}/exec",
                            {"argv": ["sh", "-c", "cat; echo done"], "stdin": text})
            check("exec stdin", r["stdout"] == text + "done\n" and r["exit_code"] == 0, r)
            # 2. streamed.
            out, err, last = sse(url, key, f"/v1/sessions/{session}/exec/stream",
                                 {"argv": ["sh", "-c", 'i=0; while [ $i -lt 50 ]; do echo line$i; '
                                           'echo e$i >&2; i=$((i+1)); done']})
            want_out = "".join(f"line{i}\n" for i in range(50))
            want_err = "".join(f"e{i}\n" for i in range(50))
            check("exec stream", out == want_out and err == want_err and last
                  and last[0] == "exit" and last[1]["exit_code"] == 0, (len(out), len(err), last))
            # 3. a file in and out.
            blob = os.urandom(200_000 + n)
            quoted = urllib.parse.quote(base)
            status, _ = raw(client, "PUT", f"/v1/sessions/{session}/files?path={quoted}", blob,
                            {"Content-Type": "application/octet-stream"})
            check("upload", status in (200, 201), status)
            status, back = raw(client, "GET", f"/v1/sessions/{session}/files?path={quoted}")
            check("download", status == 200 and back == blob, (status, len(back)))
            r = client.call("POST", f"/v1/sessions/{session}/exec",
                            {"argv": ["sh", "-c", f"wc -c < {base}; rm {base}"]})
            check("file in sandbox", r["stdout"].strip() == str(len(blob)), r)
            # 4. a background process.
            started = client.call("POST", f"/v1/sessions/{session}/processes",
                                  {"argv": ["sh", "-c", f"echo bg{n}; exit 3"]})
            pid = started["process_id"]
            info = client.call("POST", f"/v1/sessions/{session}/processes/{pid}/wait?timeout_ms=60000")
            check("process wait", info["state"] == "exited" and info["exit_code"] == 3, info)
            status, body = raw(client, "GET", f"/v1/sessions/{session}/processes/{pid}/output")
            check("process output", status == 200 and body == f"bg{n}\n".encode(), (status, body[:100]))
            # Every 4th round: a directory in and out as tar; one-shot code.
            if n % 4 == 0:
                files = {f"d/f{i}": os.urandom(1000 * i + n) for i in range(1, 4)}
                files["top"] = f"{index}-{n}".encode()
                status, body = raw(client, "PUT",
                                   f"/v1/sessions/{session}/archive?path={quoted}.d",
                                   tar_of(files), {"Content-Type": "application/x-tar"})
                check("archive upload", status == 201, (status, body[:200]))
                status, body = raw(client, "GET", f"/v1/sessions/{session}/archive?path={quoted}.d")
                back = status == 200 and files_of_tar(body)
                check("archive download", back == files,
                      (status, sorted(back) if isinstance(back, dict) else back))
                status, body = raw(client, "DELETE",
                                   f"/v1/sessions/{session}/files?path={quoted}.d&recursive=true")
                check("directory delete", status == 204, (status, body[:200]))
                r = client.call("POST", "/v1/execute", {"code": f"x = {n}\nx * 2"})
                check("execute", r["stdout"] == f"{2 * n}\n" and r["exit_code"] == 0, r)
            # Every 8th round: snapshot, fork, restore; pause and resume.
            if n % 8 == 0:
                mark = f"{index}-{n}"
                client.exec(session, ["sh", "-c", f"echo {mark} > /workspace/mark"])
                snap = client.call("POST", f"/v1/sessions/{session}/snapshots", {})["snapshot_id"]
                fork = client.create(snapshot=snap)
                r = client.exec(fork, ["cat", "/workspace/mark"])
                check("fork", r["stdout"] == f"{mark}\n", r)
                client.delete(fork)
                client.exec(session, ["sh", "-c", "echo changed > /workspace/mark"])
                client.call("POST", f"/v1/sessions/{session}/restore", {"snapshot_id": snap})
                r = client.exec(session, ["cat", "/workspace/mark"])
                check("restore", r["stdout"] == f"{mark}\n", r)
                status, body = raw(client, "DELETE", f"/v1/snapshots/{snap}")
                check("snapshot delete", status == 204, (status, body[:200]))
                client.call("POST", f"/v1/sessions/{session}/pause", {})
                client.call("POST", f"/v1/sessions/{session}/resume", {})
                r = client.exec(session, ["echo", "resumed"])
                check("resume", r["stdout"] == "resumed\n", r)
            # 5. a lot of output.
            r = client.call("POST", f"/v1/sessions/{session}/exec",
                            {"argv": ["sh", "-c", "head -c 300000 /dev/zero | tr '\\0' a"]})
            check("large output", r["stdout"] == "a" * 300000 and not r["stdout_truncated"],
                  (len(r["stdout"]), r["exit_code"], r["stdout_truncated"]))
    except Exception as e:  # noqa: BLE001 - counted as an error
        with lock:
            errors.append(f"exception: {e!r}"[:300])
    finally:
        try:
            client.delete(session)
        except Exception as e:  # noqa: BLE001
            with lock:
                errors.append(f"delete: {e!r}"[:300])
    with lock:
        counts.append(n)


def short_lived(what, round_of):
    """A worker that creates a session, runs one command in it and deletes it, over
    and over. `round_of(index, n)` gives the create body, the command and the
    output it must print."""

    def work(url, key, deadline, counts, errors, lock, index):
        client = Client(url, key)
        n = 0
        try:
            while time.time() < deadline:
                n += 1
                body, argv, want = round_of(index, n)
                session = client.create(**body)
                try:
                    r = client.exec(session, argv)
                    if r["stdout"] != want or r["exit_code"] != 0:
                        with lock:
                            errors.append(f"{what}: {str(r)[:300]}")
                finally:
                    client.delete(session)
        except Exception as e:  # noqa: BLE001 - counted as an error
            with lock:
                errors.append(f"exception: {e!r}"[:300])
        with lock:
            counts.append(n)

    return work


# Every other session with its own limits, so it is launched cold, not pooled.
churner = short_lived("churn exec", lambda index, n: (
    {} if n % 2 else {"limits": {"memory": "300M"}, "env": {"ROUND": str(n)}},
    ["sh", "-c", f"echo {index}-{n}"],
    f"{index}-{n}\n",
))

volume_user = short_lived("volume append", lambda index, n: (
    {"volume": f"soak{index % 3}"},
    ["sh", "-c", f"echo {n} >> /volume/t{index}; tail -1 /volume/t{index}"],
    f"{n}\n",
))


def check_volumes(url, key, threads, counts_by_thread, errors):
    """Every appended line is there; no session holds a volume; then they go."""
    client = Client(url, key)
    for volume in sorted({f"soak{i % 3}" for i in range(threads)}):
        held = [v for v in client.call("GET", "/v1/volumes")["volumes"] if v["name"] == volume]
        if held and held[0]["sessions"]:
            errors.append(f"{volume} still held by {held[0]['sessions']}")
        session = client.create(volume=volume)
        try:
            for i in range(threads):
                if f"soak{i % 3}" != volume:
                    continue
                r = client.exec(session, ["sh", "-c", f"cat /volume/t{i} 2>/dev/null | wc -l"])
                if r["stdout"].strip() != str(counts_by_thread[i]):
                    errors.append(f"{volume}/t{i}: {r['stdout'].strip()} lines, "
                                  f"{counts_by_thread[i]} appended")
        finally:
            client.delete(session)
        status, body = raw(client, "DELETE", f"/v1/volumes/{volume}")
        if status != 204:
            errors.append(f"delete {volume}: {status} {body[:200]!r}")


def main():
    url, key, sessions, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    hogs = int(sys.argv[5]) if len(sys.argv) > 5 else 2
    mode = sys.argv[6] if len(sys.argv) > 6 else "mixed"
    deadline = time.time() + seconds
    procs = [multiprocessing.Process(target=hog, args=(deadline,)) for _ in range(hogs)]
    for p in procs:
        p.start()
    counts, errors, lock = [], [], threading.Lock()
    target = {"churn": churner, "volumes": volume_user}.get(mode, worker)
    by_thread = {}

    def run(i):
        mine = []
        target(url, key, deadline, mine, errors, lock, i)
        by_thread[i] = mine[0] if mine else 0
        with lock:
            counts.extend(mine)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p in procs:
        p.join()
    if mode == "volumes":
        check_volumes(url, key, sessions, by_thread, errors)
    left = Client(url, key).call("GET", "/v1/sessions")["sessions"]
    if left:
        errors.append(f"{len(left)} sessions left: {[s['session_id'] for s in left][:5]}")
    result = {"sessions": sessions, "seconds": seconds, "hogs": hogs, "mode": mode,
              "rounds": sum(counts), "errors": len(errors)}
    if errors:
        result["first_errors"] = errors[:5]
    print(json.dumps(result))
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
