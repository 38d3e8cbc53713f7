#!/usr/bin/env python3
"""Load generator for `brig serve` benchmarks (bench/daemon.sh runs it).

    daemon_load.py URL KEY rtt N                 exec round trips, one live session
    daemon_load.py URL KEY create N              session create -> first exec -> delete
    daemon_load.py URL KEY idle N DAEMON_PID     N idle sessions: memory per session
    daemon_load.py URL KEY concurrent S SECONDS  S sessions, one client thread each

Every client keeps one HTTP/1.1 connection open (as an SDK would), so the numbers
are the daemon's and the sandbox's, not TCP set-up's. Prints one JSON object.
"""

import http.client
import json
import os
import statistics
import sys
import threading
import time
import urllib.parse


class Client:
    def __init__(self, url, key):
        parts = urllib.parse.urlsplit(url)
        self.host, self.port = parts.hostname, parts.port
        self.key = key
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=120)

    def call(self, method, path, body=None):
        raw = self.call_text(method, path, body)
        return json.loads(raw) if raw else None

    def call_text(self, method, path, body=None):
        headers = {"Authorization": f"Bearer {self.key}"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        for attempt in range(2):
            try:
                self.conn.request(method, path, body=data, headers=headers)
                response = self.conn.getresponse()
                raw = response.read()
                break
            except (http.client.HTTPException, ConnectionError):
                if attempt:
                    raise
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=120)
        if response.status >= 300 and response.status != 204:
            raise RuntimeError(f"{method} {path}: {response.status} {raw[:300]!r}")
        return raw.decode()

    def create(self, **body):
        return self.call("POST", "/v1/sessions", body)["session_id"]

    def exec(self, session, argv):
        return self.call("POST", f"/v1/sessions/{session}/exec", {"argv": argv})

    def delete(self, session):
        self.call("DELETE", f"/v1/sessions/{session}")


def summary(samples_ms):
    samples = sorted(samples_ms)
    pick = lambda q: samples[min(len(samples) - 1, int(q * len(samples)))]
    return {
        "n": len(samples),
        "median_ms": round(statistics.median(samples), 3),
        "p95_ms": round(pick(0.95), 3),
        "p99_ms": round(pick(0.99), 3),
        "min_ms": round(samples[0], 3),
        "max_ms": round(samples[-1], 3),
    }


def rtt(client, n):
    session = client.create()
    try:
        for _ in range(20):
            client.exec(session, ["echo", "hello"])
        samples = []
        for _ in range(n):
            start = time.perf_counter()
            result = client.exec(session, ["echo", "hello"])
            samples.append((time.perf_counter() - start) * 1000)
            assert result["stdout"] == "hello\n", result
        return summary(samples)
    finally:
        client.delete(session)


def pool_ready(client):
    text = client.call_text("GET", "/metrics")
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("brig_pool_ready")
    )


def create(client, n, pattern):
    """Session create -> first exec, `n` times. `pattern`:
    - "cold": no pool;
    - "pooled": 0.3 s between creates, for the pool to refill (the daemon launches
      once nothing was taken for 100 ms); an idle machine between requests;
    - "busy": back to back, from a pool holding at least `n` ready sandboxes (waited
      for first; the daemon refills after the burst unless less than half the pool
      is left, so give it a pool of more than 2n), so that no refill runs meanwhile;
      a daemon kept busy.
    """
    if pattern == "busy":
        # Full: at least n ready, and no launch under way (a second later, the same).
        last = None
        for _ in range(120):
            ready = pool_ready(client)
            if ready >= n and ready == last:
                break
            last = ready
            time.sleep(1)
        else:
            raise SystemExit(f"the pool never settled with {n} sandboxes")
    samples, creates, first_execs = [], [], []
    was_pooled = []
    for _ in range(n):
        if pattern == "pooled":
            time.sleep(0.3)
        start = time.perf_counter()
        session = client.call("POST", "/v1/sessions", {})
        created = time.perf_counter()
        result = client.exec(session["session_id"], ["echo", "hello"])
        done = time.perf_counter()
        samples.append((done - start) * 1000)
        creates.append((created - start) * 1000)
        first_execs.append((done - created) * 1000)
        was_pooled.append(session["pooled"])
        assert result["stdout"] == "hello\n", result
        client.delete(session["session_id"])
    out = summary(samples)
    out["pooled"] = sum(was_pooled)
    # The two halves, to see which one moved.
    out["create_median_ms"] = round(statistics.median(creates), 3)
    out["first_exec_median_ms"] = round(statistics.median(first_execs), 3)
    return out


def meminfo_available_kb():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    raise RuntimeError("no MemAvailable")


def children(pid):
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            out += [int(p) for p in f.read().split()]
    return out


def pss_kb(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def idle(client, n, daemon_pid):
    before_children = set(children(daemon_pid))
    os.system("sync; echo 3 > /proc/sys/vm/drop_caches")
    time.sleep(1)
    before = meminfo_available_kb()
    daemon_pss_before = pss_kb(daemon_pid)
    sessions = []
    start = time.perf_counter()
    try:
        for _ in range(n):
            sessions.append(client.create())
        created_s = time.perf_counter() - start
        # Every session still answers.
        for session in sessions[:: max(1, n // 50)]:
            assert client.exec(session, ["true"])["exit_code"] == 0
        time.sleep(2)
        os.system("sync; echo 3 > /proc/sys/vm/drop_caches")
        time.sleep(1)
        after = meminfo_available_kb()
        inits = [p for p in children(daemon_pid) if p not in before_children]
        pss = [pss_kb(p) for p in inits]
        daemon_pss_after = pss_kb(daemon_pid)
        return {
            "sessions": n,
            "create_all_s": round(created_s, 1),
            "memavailable_drop_mib": round((before - after) / 1024, 1),
            "per_session_kib_memavailable": round((before - after) / n, 1),
            "init_processes": len(inits),
            "init_pss_kib_median": statistics.median(pss) if pss else None,
            "init_pss_kib_total": sum(pss),
            "daemon_pss_growth_kib": daemon_pss_after - daemon_pss_before,
        }
    finally:
        for session in sessions:
            client.delete(session)


def concurrent(url, key, sessions_n, seconds):
    setup = Client(url, key)
    sessions = [setup.create() for _ in range(sessions_n)]
    samples = []
    errors = []
    lock = threading.Lock()
    deadline = time.perf_counter() + seconds

    def worker(session):
        client = Client(url, key)
        mine = []
        try:
            while time.perf_counter() < deadline:
                start = time.perf_counter()
                result = client.exec(session, ["echo", "hello"])
                mine.append((time.perf_counter() - start) * 1000)
                if result["stdout"] != "hello\n":
                    errors.append(result)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(str(e))
        with lock:
            samples.extend(mine)

    threads = [threading.Thread(target=worker, args=(s,)) for s in sessions]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for session in sessions:
            setup.delete(session)
    out = summary(samples)
    out["sessions"] = sessions_n
    out["seconds"] = seconds
    out["execs_per_s"] = round(len(samples) / seconds, 1)
    out["errors"] = len(errors)
    if errors:
        out["first_error"] = str(errors[0])[:300]
    return out


def main():
    url, key, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    args = sys.argv[4:]
    client = Client(url, key)
    if mode == "rtt":
        result = rtt(client, int(args[0]))
    elif mode == "create":
        result = create(client, int(args[0]), args[1] if len(args) > 1 else "cold")
    elif mode == "idle":
        result = idle(client, int(args[0]), int(args[1]))
    elif mode == "concurrent":
        result = concurrent(url, key, int(args[0]), float(args[1]))
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
