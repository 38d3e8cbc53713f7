#!/usr/bin/env bash
# Egress through brig's proxy vs a direct loopback connection, in one run (root).
#   CONNECT setup: median time from connect() to the proxy's "200" (inside the
#     sandbox) vs connect() straight to the upstream (on the host); N each.
#   Throughput: a 2 GiB download (the upstream sendfile()s) with curl, straight on
#     the host vs through CONNECT, plain HTTP and transparent capture.
#   The peer: tinyproxy (a plain forwarding proxy, no policy) on the host's loopback,
#     the same setup and downloads through it, from the host (installed if missing).
# Usage: bench/egress.sh [path/to/brig]   (default: the release build)
set -euo pipefail
cd "$(dirname "$0")/.."
brig=${1:-target/x86_64-unknown-linux-gnu/release/brig}
# Fewer than the 256 connections a sandbox may hold: a closed tunnel frees its slot
# only once the upstream closes too.
n=${N:-200}
work=$(mktemp -d)
chmod 755 "$work"
peer=
trap 'kill $server $peer 2>/dev/null || true; rm -rf "$work"' EXIT
command -v tinyproxy >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tinyproxy >/dev/null
truncate -s 2G "$work/big.bin"
cat "$work/big.bin" >/dev/null
cat >"$work/server.py" <<'PY'
import os, socket, sys, threading
path = sys.argv[1]; size = os.path.getsize(path)
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1024)
print(s.getsockname()[1], flush=True)
def serve(c):
    try:
        if c.recv(65536).startswith(b"GET"):
            c.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
            with open(path, "rb") as f:
                c.sendfile(f)
    except OSError:
        pass
    c.close()
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
PY
cat >"$work/setup.py" <<'PY'
import socket, statistics, sys, time
mode, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
times = []
for _ in range(n):
    t = time.perf_counter()
    if mode == "direct":
        s = socket.create_connection(("127.0.0.1", port))
    elif mode == "peer":
        s = socket.create_connection(("127.0.0.1", int(sys.argv[4])))
        s.sendall(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\n" % port)
        reply = s.recv(4096)
        assert b" 200 " in reply, reply
    else:
        s = socket.create_connection(("127.0.0.1", 3128))
        s.sendall(b"CONNECT up.test:%d HTTP/1.1\r\n\r\n" % port)
        reply = s.recv(4096)
        assert b" 200 " in reply, reply
    times.append(time.perf_counter() - t)
    s.close()
print("%s setup median %.3f ms, p90 %.3f ms" % (mode, statistics.median(times) * 1e3,
      statistics.quantiles(times, n=10)[8] * 1e3))
PY
/usr/bin/python3 "$work/server.py" "$work/big.bin" >"$work/port" &
server=$!
while [ ! -s "$work/port" ]; do sleep 0.1; done
port=$(cat "$work/port")
echo "127.0.0.1 up.test" >"$work/hosts"
peer_port=18888
printf '%s\n' "Port $peer_port" "Listen 127.0.0.1" "Allow 127.0.0.1" "MaxClients 1024" \
  "LogLevel Critical" "User nobody" "Group nogroup" >"$work/tinyproxy.conf"
tinyproxy -d -c "$work/tinyproxy.conf" &
peer=$!
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$peer_port) 2>/dev/null && break; sleep 0.1; done
/usr/bin/python3 "$work/setup.py" direct "$port" "$n"
/usr/bin/python3 "$work/setup.py" peer "$port" "$n" "$peer_port"
for i in 1 2 3; do
  curl -s -o /dev/null -w "direct %{speed_download} B/s\n" "http://127.0.0.1:$port/"
  curl -s -o /dev/null -w "peer-connect %{speed_download} B/s\n" -p -x "http://127.0.0.1:$peer_port" "http://127.0.0.1:$port/"
  curl -s -o /dev/null -w "peer-http %{speed_download} B/s\n" -x "http://127.0.0.1:$peer_port" "http://127.0.0.1:$port/"
done
"$brig" run --timeout 10m --memory 1G --cpus none --bind "$work:/bench" --network allow --allow-host up.test \
  --egress-hosts "$work/hosts" --egress-allow-private 127.0.0.0/8 -- sh -c "
  /usr/bin/python3 /bench/setup.py connect $port $n
  for i in 1 2 3; do
    curl -s -o /dev/null -w 'connect %{speed_download} B/s\n' -p -x http://127.0.0.1:3128 http://up.test:$port/
    curl -s -o /dev/null -w 'http %{speed_download} B/s\n' http://up.test:$port/
    curl -s -o /dev/null -w 'capture %{speed_download} B/s\n' --noproxy '*' http://up.test:$port/
  done"
