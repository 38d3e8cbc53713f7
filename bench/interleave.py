#!/usr/bin/env python3
"""Interleaved A/B timing for a noisy machine: runs each command once per round,
round-robin, and prints each one's median and quartiles, so a slow phase of the host
hits every command alike (hyperfine runs one command's runs back to back).

    bench/interleave.py ROUNDS NAME=CMD [NAME=CMD...]

Each time includes this script's posix_spawn and wait (~0.4 ms here), the same for
every command: compare differences, or subtract a NAME=/bin/true row. The first 10
rounds are warm-up and not counted. A command that fails stops the run."""
import os
import shlex
import statistics
import sys
import time

rounds = int(sys.argv[1])
commands = [(arg.split("=", 1)[0], shlex.split(arg.split("=", 1)[1])) for arg in sys.argv[2:]]
devnull = os.open(os.devnull, os.O_RDWR)
times = {name: [] for name, _ in commands}
for round_ in range(rounds + 10):
    for name, argv in commands:
        start = time.perf_counter_ns()
        pid = os.posix_spawn(
            argv[0], argv, os.environ, file_actions=[(os.POSIX_SPAWN_DUP2, devnull, 1)]
        )
        _, status = os.waitpid(pid, 0)
        elapsed_ms = (time.perf_counter_ns() - start) / 1e6
        if status != 0:
            sys.exit(f"{name} failed (wait status {status})")
        if round_ >= 10:
            times[name].append(elapsed_ms)
for name, _ in commands:
    v = sorted(times[name])
    q1, q3 = v[len(v) // 4], v[3 * len(v) // 4]
    print(f"{name:16s} median {statistics.median(v):7.3f}  p25 {q1:7.3f}  p75 {q3:7.3f} ms")
