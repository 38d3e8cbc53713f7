#!/usr/bin/env python3
"""The stateful interpreter on `brig serve` (issue 33). Run as root from the repository:

    bench/interpreter.py BRIG_BINARY [FRESH] [LIVE]

1. First run_code in a fresh session: FRESH rounds, each creating a session (not
   timed) and timing `POST /v1/sessions/{id}/code {"code": "1+1"}`, which starts the
   context's kernel; the peer, in another fresh session of the same round, is its
   first exec of `python3 -c 1+1`.
2. Round trip of `1+1` in a live context: LIVE calls in one session, each followed
   by the peer, an exec of `python3 -c 1+1` in the same session (interleaved, so
   both see the same machine).

Sessions on the host's dirs (`--default-image host`). Prints one JSON object of
medians (ms), with p10 and p90.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon_load import Client  # noqa: E402
from egress_sessions import free_port  # noqa: E402


def start(brig, work):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [brig, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", f"{work}/data",
         "--store", f"{work}/store", "--default-image", "host"],
        stdout=open(f"{work}/daemon.log", "w"), stderr=subprocess.STDOUT)
    for _ in range(400):
        try:
            with open(f"{work}/data/admin.key") as k:
                key = k.read().strip()
            Client(url, key).call("GET", "/v1/sessions")
            return proc, Client(url, key)
        except (OSError, RuntimeError, ConnectionError):
            time.sleep(0.05)
    raise RuntimeError("the daemon did not start")


def timed(f):
    t = time.perf_counter()
    out = f()
    return (time.perf_counter() - t) * 1000, out


def code(client, session):
    r = client.call("POST", f"/v1/sessions/{session}/code", {"code": "1+1"})
    assert r["results"][0]["data"]["text/plain"] == "2", r
    return r


def exec_peer(client, session):
    r = client.exec(session, ["python3", "-c", "1+1"])
    assert r["exit_code"] == 0, r
    return r


def stats(samples):
    q = statistics.quantiles(samples, n=10)
    return {"median": round(statistics.median(samples), 2), "p10": round(q[0], 2),
            "p90": round(q[-1], 2), "n": len(samples)}


def main():
    brig = sys.argv[1]
    fresh = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    live = int(sys.argv[3]) if len(sys.argv) > 3 else 200
    work = tempfile.mkdtemp(prefix="brig-interp-bench-")
    proc, client = start(brig, work)
    try:
        first_code, first_exec = [], []
        for i in range(fresh + 2):
            a, b = client.create(), client.create()
            ms_code, _ = timed(lambda: code(client, a))
            ms_exec, _ = timed(lambda: exec_peer(client, b))
            client.delete(a)
            client.delete(b)
            if i >= 2:  # warm-up
                first_code.append(ms_code)
                first_exec.append(ms_exec)
        session = client.create()
        for _ in range(10):
            code(client, session)
            exec_peer(client, session)
        rtt_code, rtt_exec = [], []
        for _ in range(live):
            rtt_code.append(timed(lambda: code(client, session))[0])
            rtt_exec.append(timed(lambda: exec_peer(client, session))[0])
        client.delete(session)
        print(json.dumps({
            "first_run_code_fresh_session": stats(first_code),
            "first_exec_python3_fresh_session": stats(first_exec),
            "run_code_1plus1_live_context": stats(rtt_code),
            "exec_python3_c_1plus1_same_session": stats(rtt_exec),
        }, indent=1))
    finally:
        proc.terminate()
        proc.wait()
        subprocess.run(["rm", "-rf", work])


if __name__ == "__main__":
    main()
