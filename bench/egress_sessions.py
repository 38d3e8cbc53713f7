#!/usr/bin/env python3
"""Sessions' egress on `brig serve` (issue 32). Run as root from the repository:

    bench/egress_sessions.py BRIG_BINARY [ROUNDS] [SESSIONS]

1. Idle memory: ROUNDS rounds, each creating SESSIONS idle sessions with network
   `none`, then SESSIONS with `allow` (the order swapped every other round), on one
   daemon. Per session: the MemAvailable drop (page cache dropped before and after),
   the daemon's PSS growth, and the median PSS of the sessions' inits. Medians over
   the rounds.
2. 1,000 concurrent proxied connections across 100 sessions: 100 execs at once,
   each opening 10 CONNECT tunnels to an echo server on the host's loopback,
   holding them all open for 3 s (so the 1,000 overlap), then echoing on each;
   every refusal, reset or wrong echo counts as an error.

All traffic stays on loopback: names resolve through `--egress-hosts`, and
127.0.0.0/8 is opened with `--egress-allow-private`. Prints one JSON object.
"""

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon_load import Client, children, meminfo_available_kb, pss_kb  # noqa: E402


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def echo_server():
    """A threaded echo server on the host's loopback; its port."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(4096)

    def serve(conn):
        with conn:
            while True:
                data = conn.recv(65536)
                if not data:
                    return
                conn.sendall(data)

    def accept():
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return listener.getsockname()[1]


def drop_caches():
    os.system("sync; echo 3 > /proc/sys/vm/drop_caches")
    time.sleep(1)


def status_kb(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def meminfo_kb(field):
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


SOCKET_CACHES = {"TCP", "TCPv6", "UDP", "UDPv6", "sock_inode_cache"}


def socket_slab_kib():
    """Memory of the slab caches sockets live in (all of the host's)."""
    total = 0
    with open("/proc/slabinfo") as f:
        for line in f:
            fields = line.split()
            if fields and fields[0] in SOCKET_CACHES:
                total += int(fields[2]) * int(fields[3])
    return total / 1024


def idle_round(client, daemon_pid, network, n):
    """N idle sessions of one network on a fresh daemon: what each adds."""
    # Warm-up: the daemon's first sessions of a kind allocate what later ones reuse.
    for s in [client.create(network=network) for _ in range(5)]:
        client.delete(s)
    before_children = set(children(daemon_pid))
    drop_caches()
    before = {
        "avail": meminfo_available_kb(),
        "sunreclaim": meminfo_kb("SUnreclaim"),
        "anon": status_kb(daemon_pid, "RssAnon"),
        "sockets": socket_slab_kib(),
    }
    sessions = []
    try:
        for _ in range(n):
            sessions.append(client.create(network=network))
        for s in sessions[:: max(1, n // 10)]:
            assert client.exec(s, ["true"])["exit_code"] == 0
        time.sleep(2)
        drop_caches()
        inits = [p for p in children(daemon_pid) if p not in before_children]
        pss = [pss_kb(p) for p in inits]
        return {
            "memavailable_kib": (before["avail"] - meminfo_available_kb()) / n,
            "slab_unreclaimable_kib": (meminfo_kb("SUnreclaim") - before["sunreclaim"]) / n,
            "daemon_rss_anon_kib": (status_kb(daemon_pid, "RssAnon") - before["anon"]) / n,
            "socket_slab_kib": (socket_slab_kib() - before["sockets"]) / n,
            "init_pss_kib_median": statistics.median(pss) if pss else None,
        }
    finally:
        for s in sessions:
            client.delete(s)


CLIENT = r"""
import socket, sys, time
port, n, hold = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
socks, errors = [], []
for i in range(n):
    try:
        s = socket.create_connection(("127.0.0.1", 3128), timeout=60)
        s.sendall(("CONNECT up.test:%d HTTP/1.1\r\nHost: up.test\r\n\r\n" % port).encode())
        head = b""
        while b"\r\n\r\n" not in head:
            d = s.recv(1)
            if not d:
                break
            head += d
        if b" 200 " not in head:
            errors.append(head[:60].decode(errors="replace"))
            continue
        socks.append(s)
    except OSError as e:
        errors.append(str(e))
time.sleep(hold)
for i, s in enumerate(socks):
    try:
        payload = ("hello %d\n" % i).encode()
        s.sendall(payload)
        got = b""
        while len(got) < len(payload):
            d = s.recv(100)
            if not d:
                break
            got += d
        if got != payload:
            errors.append("echo %r" % got)
        s.close()
    except OSError as e:
        errors.append(str(e))
print(len(socks), len(errors), errors[:3])
"""


def concurrent(url, key, port, sessions_n, per_session, hold):
    setup = Client(url, key)
    network = {"mode": "allow", "allow": [f"up.test:{port}"]}
    sessions = [setup.create(network=network) for _ in range(sessions_n)]
    results = []
    lock = threading.Lock()

    def run(session):
        client = Client(url, key)
        r = client.call(
            "POST",
            f"/v1/sessions/{session}/exec",
            {"argv": ["/usr/bin/python3", "-c", CLIENT, str(port), str(per_session), str(hold)],
             "timeout_ms": 60000},
        )
        with lock:
            results.append(r)

    try:
        start = time.perf_counter()
        threads = [threading.Thread(target=run, args=(s,)) for s in sessions]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start
        opened = errors = 0
        samples = []
        for r in results:
            fields = r["stdout"].split(" ", 2)
            if r["exit_code"] != 0 or len(fields) < 2:
                errors += per_session
                samples.append(r["stderr"][-200:])
                continue
            opened += int(fields[0])
            errors += int(fields[1])
            if int(fields[1]):
                samples.append(fields[2].strip())
        return {
            "sessions": sessions_n,
            "connections_asked": sessions_n * per_session,
            "connections_open_at_once": opened,
            "errors": errors,
            "error_samples": samples[:3],
            "wall_s": round(elapsed, 1),
        }
    finally:
        for s in sessions:
            setup.delete(s)


class Daemon:
    def __init__(self, brig, work, hosts):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        data = tempfile.mkdtemp(dir=work)
        self.proc = subprocess.Popen(
            [brig, "serve", "--listen", f"127.0.0.1:{self.port}", "--data-dir", f"{data}/data",
             "--store", f"{data}/store", "--default-image", "host", "--egress-hosts", hosts,
             "--egress-allow-private", "127.0.0.0/8", "--max-concurrent-execs", "512"],
            stdout=open(f"{data}/daemon.log", "w"), stderr=subprocess.STDOUT)
        for _ in range(400):
            try:
                with open(f"{data}/data/admin.key") as k:
                    self.key = k.read().strip()
                Client(self.url, self.key).call("GET", "/v1/sessions")
                break
            except (OSError, RuntimeError, ConnectionError):
                time.sleep(0.05)
        self.client = Client(self.url, self.key)
        self.client.call("PUT", "/v1/tenants/admin/quotas",
                         {"max_sessions": 5000, "max_concurrent_execs": 500,
                          "max_disk_bytes": "1000T"})

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def main():
    brig = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 100
    work = tempfile.mkdtemp(prefix="brig-egress-bench-")
    hosts = os.path.join(work, "hosts")
    with open(hosts, "w") as f:
        f.write("127.0.0.1 up.test\n")
    upstream = echo_server()
    modes = {"none": {"mode": "none"},
             "allow": {"mode": "allow", "allow": [f"up.test:{upstream}"]}}
    try:
        idle = {"none": [], "allow": []}
        for r in range(rounds):
            order = ["none", "allow"] if r % 2 == 0 else ["allow", "none"]
            for mode in order:
                daemon = Daemon(brig, work, hosts)
                try:
                    idle[mode].append(idle_round(daemon.client, daemon.proc.pid, modes[mode], n))
                finally:
                    daemon.stop()
        summary = {}
        for mode, runs in idle.items():
            summary[mode] = {k: round(statistics.median(run[k] for run in runs), 1)
                             for k in runs[0]}
            summary[mode]["rounds"] = [
                {k: round(v, 1) for k, v in run.items()} for run in runs]
        out = {"idle_sessions_per_round": n, "idle": summary}
        daemon = Daemon(brig, work, hosts)
        try:
            out["concurrent"] = concurrent(daemon.url, daemon.key, upstream, 100, 10, 3.0)
        finally:
            daemon.stop()
        print(json.dumps(out, indent=1))
    finally:
        subprocess.run(["rm", "-rf", work])


if __name__ == "__main__":
    main()
