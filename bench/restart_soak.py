#!/usr/bin/env python3
"""`brig serve` killed with SIGKILL three times while 20 sessions run execs, checked.

    restart_soak.py BRIG WORKDIR PORT

Starts a daemon (data and store under WORKDIR, a pool of 4), creates 20 sessions
and runs, from one thread per session for 20 s, execs that echo their stdin back.
Every 5 s the daemon is killed with SIGKILL and started again. Requests made while
it is down fail (counted, allowed); every answer that comes must be exactly right,
every session must still be there and answer afterwards, and after they are
deleted and the daemon stopped nothing may be left (check cgroups, mounts and
WORKDIR/data/sessions yourself). Prints one JSON object.
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True
from daemon_load import Client  # noqa: E402
brig, data, port = sys.argv[1], sys.argv[2], sys.argv[3]
os.makedirs(data, exist_ok=True)
url = f"http://127.0.0.1:{port}"


def start():
    p = subprocess.Popen([brig, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", f"{data}/data",
                          "--store", f"{data}/store", "--default-image", "host", "--pool", "host=4"],
                         stdout=open(f"{data}/log", "a"), stderr=subprocess.STDOUT, start_new_session=True)
    for _ in range(200):
        try:
            Client(url, "x").call_text("GET", "/health")
            return p
        except Exception:  # noqa: BLE001 - not up yet
            time.sleep(0.05)
    raise SystemExit("the daemon did not start")


d = start()
key = open(f"{data}/data/admin.key").read().strip()
c = Client(url, key)
c.call("PUT", "/v1/tenants/admin/quotas", {"max_sessions": 500, "max_concurrent_execs": 100})
sessions = [c.create() for _ in range(20)]
stop = time.time() + 20
wrong, failed, ok = [], [0], [0]
lock = threading.Lock()


def worker(s, i):
    cl = Client(url, key); n = 0
    while time.time() < stop:
        n += 1; text = f"{i}-{n}\n"
        try:
            r = cl.call("POST", f"/v1/sessions/{s}/exec", {"argv": ["sh", "-c", "cat; sleep 0.05"], "stdin": text})
            with lock:
                if r["stdout"] == text and r["exit_code"] == 0: ok[0] += 1
                else: wrong.append(r)
        except Exception:  # noqa: BLE001 - the daemon is down: allowed, counted
            with lock:
                failed[0] += 1
            time.sleep(0.05)
            cl = Client(url, key)


ts = [threading.Thread(target=worker, args=(s, i)) for i, s in enumerate(sessions)]
[t.start() for t in ts]
for k in range(3):
    time.sleep(5)
    os.kill(d.pid, signal.SIGKILL); d.wait()
    time.sleep(0.5)
    d = start()
[t.join() for t in ts]
c = Client(url, key)
live = [s["session_id"] for s in c.call("GET", "/v1/sessions")["sessions"]]
missing = set(sessions) - set(live)
after = [c.exec(s, ["echo", "ok"])["stdout"] for s in sessions if s in live]
for s in live: c.delete(s)
print(json.dumps({"ok": ok[0], "failed_requests": failed[0], "wrong": len(wrong), "first_wrong": [str(w)[:300] for w in wrong[:3]],
                  "missing_sessions": len(missing), "answer_after": after.count("ok\n"), "left": len(c.call("GET", "/v1/sessions")["sessions"])}))
d.terminate(); d.wait()
