#!/usr/bin/env python3
"""E2B's SDKs against `brig serve`, side by side with brig's own SDK (issue 34).
Run as root from the repository, with the test venv (it has both SDKs):

    target/test-venv/bin/python bench/e2b_sdk.py BRIG_BINARY [ROUNDS]

1. Create + first command: `Sandbox.create()` then `commands.run("echo hi")`, then
   kill, through e2b 2.63.0 (`E2B_API_URL`/`E2B_SANDBOX_URL` at the daemon), and
   the same through brig's SDK (`brig.Sandbox.create()`, `commands.run`, `kill`),
   interleaved round by round so both see the same machine. Only create+run is
   timed; the kill is not.
2. `run_code("1+1")` round trip in a live sandbox through e2b-code-interpreter
   2.11.5, interleaved with brig's SDK `run_code("1+1")` in a sandbox of its own
   (after one warm-up call each, which starts the kernel).

Sandboxes on the host's dirs (`--default-image host`). Prints one JSON object of
medians (ms) with p10 and p90.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
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
            if key:
                import urllib.request
                urllib.request.urlopen(f"{url}/health", timeout=1)
                return proc, url, key
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError("the daemon did not start")


def stats(samples):
    samples = sorted(samples)
    pick = lambda q: samples[min(len(samples) - 1, int(q * len(samples)))]  # noqa: E731
    return {"median": round(statistics.median(samples), 2), "p10": round(pick(0.1), 2),
            "p90": round(pick(0.9), 2), "n": len(samples)}


def main():
    brig_bin = os.path.abspath(sys.argv[1])
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    with tempfile.TemporaryDirectory() as work:
        proc, url, key = start(brig_bin, work)
        try:
            os.environ.update(E2B_API_URL=url, E2B_SANDBOX_URL=url, E2B_API_KEY=key,
                              BRIG_URL=url, BRIG_API_KEY=key)
            import brig
            import e2b
            import e2b_code_interpreter

            create_e2b, create_brig = [], []
            for _ in range(rounds):
                t = time.perf_counter()
                sbx = e2b.Sandbox.create()
                assert sbx.commands.run("echo hi").stdout == "hi\n"
                create_e2b.append((time.perf_counter() - t) * 1000)
                sbx.kill()
                t = time.perf_counter()
                b = brig.Sandbox.create()
                assert b.commands.run("echo hi").stdout == "hi\n"
                create_brig.append((time.perf_counter() - t) * 1000)
                b.kill()

            ci = e2b_code_interpreter.Sandbox.create()
            b = brig.Sandbox.create()
            code_e2b, code_brig = [], []
            try:
                assert ci.run_code("1+1").text == "2"
                assert b.run_code("1+1").text == "2"
                for _ in range(rounds * 3):
                    t = time.perf_counter()
                    assert ci.run_code("1+1").text == "2"
                    code_e2b.append((time.perf_counter() - t) * 1000)
                    t = time.perf_counter()
                    assert b.run_code("1+1").text == "2"
                    code_brig.append((time.perf_counter() - t) * 1000)
            finally:
                ci.kill()
                b.kill()
            print(json.dumps({
                "create_and_echo_ms": {"e2b_sdk": stats(create_e2b),
                                       "brig_sdk": stats(create_brig)},
                "run_code_1_plus_1_ms": {"e2b_code_interpreter": stats(code_e2b),
                                         "brig_sdk": stats(code_brig)},
            }, indent=2))
        finally:
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()
