#!/usr/bin/env python3
"""Pooled create -> first exec on `brig serve` daemons left idle, side by side:
an A/B of two builds on a host that reclaims idle page cache (BENCHMARKS.md,
session 23).

    bench/idle_ab.py ROUNDS IDLE_S NAME=URL,KEYFILE,PID [...]

Each round, all daemons idle IDLE_S seconds together. Then each in turn (the order
swapped every round) gets one pooled create -> first exec (`echo hello`) on a new
connection, as a client back after a pause would open, timed, with the daemon's disk
reads over it (`read_bytes` of /proc/PID/io); then each again at once ("+warm").
Sessions are deleted untimed. Prints a line per round and medians per daemon."""
import http.client
import json
import statistics
import sys
import time
import urllib.parse


class Client:
    def __init__(self, url, key):
        parts = urllib.parse.urlsplit(url)
        self.host, self.port, self.key = parts.hostname, parts.port, key
        self.conn = None

    def call(self, method, path, body=None):
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        headers = {"Authorization": f"Bearer {self.key}"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        self.conn.request(method, path, body=data, headers=headers)
        response = self.conn.getresponse()
        raw = response.read()
        if response.status >= 300 and response.status != 204:
            raise SystemExit(f"{method} {path}: {response.status} {raw[:200]!r}")
        return json.loads(raw) if raw else None


def read_bytes(pid):
    with open(f"/proc/{pid}/io") as io:
        for line in io:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    raise SystemExit(f"no read_bytes for pid {pid}")


def main():
    rounds, idle = int(sys.argv[1]), float(sys.argv[2])
    daemons = []
    for arg in sys.argv[3:]:
        name, rest = arg.split("=", 1)
        url, keyfile, pid = rest.split(",")
        with open(keyfile) as key:
            daemons.append((name, Client(url, key.read().strip()), int(pid)))
    results = {
        f"{name}{tag}": {"total": [], "create": [], "exec": [], "pages": []}
        for name, _, _ in daemons
        for tag in ("", "+warm")
    }
    for round_ in range(rounds):
        time.sleep(idle)
        order = daemons if round_ % 2 == 0 else daemons[::-1]
        line = []
        for tag, (name, client, pid) in [("", d) for d in order] + [("+warm", d) for d in order]:
            name += tag
            if not tag:
                client.conn = None
            before = read_bytes(pid)
            start = time.perf_counter()
            session = client.call("POST", "/v1/sessions", {})
            created = time.perf_counter()
            sid = session["session_id"]
            out = client.call("POST", f"/v1/sessions/{sid}/exec", {"argv": ["echo", "hello"]})
            done = time.perf_counter()
            pages = (read_bytes(pid) - before) / 4096
            assert out["stdout"] == "hello\n" and session["pooled"], (session, out)
            client.call("DELETE", f"/v1/sessions/{sid}")
            sample = results[name]
            sample["total"].append((done - start) * 1000)
            sample["create"].append((created - start) * 1000)
            sample["exec"].append((done - created) * 1000)
            sample["pages"].append(pages)
            line.append(
                f"{name}: {sample['total'][-1]:.2f} ms ({sample['create'][-1]:.2f}"
                f"+{sample['exec'][-1]:.2f}) {pages:.0f} pages"
            )
        print(f"round {round_}: " + " | ".join(line), flush=True)
    for name, sample in results.items():
        median = {k: statistics.median(v) for k, v in sample.items()}
        print(
            f"{name}: n={len(sample['total'])} median total {median['total']:.2f} ms = "
            f"create {median['create']:.2f} + first exec {median['exec']:.2f}; disk pages "
            f"read median {median['pages']:.1f}, mean {statistics.mean(sample['pages']):.1f}"
        )


if __name__ == "__main__":
    main()
