#!/bin/sh
# How much kernel memory a sandbox can take with record locks before brig kills
# what holds them (see crates/brig-jail/src/locks.rs). Runs bench/lock_flood.c in
# a 64 MiB, 2-CPU sandbox ROUNDS times, sampling the host's lock objects
# (/sys/kernel/slab/file_lock_cache/objects, an upper bound) every 10 ms, and prints
# each round's peak and how long the sandbox ran. Root only.
#
#   bench/lock_flood.sh [BRIG] [ROUNDS]
set -eu
BRIG=${1:-target/$(uname -m)-unknown-linux-gnu/release/brig}
ROUNDS=${2:-3}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cc -O2 -static -o "$WORK/lock_flood" "$(dirname "$0")/lock_flood.c"
objects() { cut -d' ' -f1 /sys/kernel/slab/file_lock_cache/objects; }
echo "baseline: $(objects) lock objects on the host"
for round in $(seq "$ROUNDS"); do
    (
        peak=0
        while [ ! -e "$WORK/done" ]; do
            n=$(objects)
            [ "$n" -gt "$peak" ] && peak=$n
            sleep 0.01
        done
        echo "$peak" > "$WORK/peak"
    ) &
    sampler=$!
    # --timeout is the backstop should the budget not be enforced.
    result=$(timeout -s KILL 30 "$BRIG" run --json --memory 64M --cpus 2 --timeout 10s \
        --bind "$WORK/lock_flood:/opt/lock_flood:ro" -- /opt/lock_flood 2 2>/dev/null || true)
    touch "$WORK/done"
    wait "$sampler"
    rm "$WORK/done"
    printf '%s' "$result" | python3 -c '
import json, sys
peak = int(sys.argv[1]); v = json.load(sys.stdin)
print("round %s: ran %s ms, file_locks_exceeded=%s, timed_out=%s, peak %d lock objects (%.0f MB at 192 B)"
      % (sys.argv[2], v["duration_ms"], v.get("file_locks_exceeded"), v["timed_out"], peak, peak * 192 / 1e6))
' "$(cat "$WORK/peak")" "$round"
done
