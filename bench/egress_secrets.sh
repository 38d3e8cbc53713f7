#!/usr/bin/env bash
# The cost of TLS interception for a secret's host, in one run (root): HTTPS
# requests from inside a sandbox, each on a new connection (CONNECT, TLS, one GET,
# the response), to a host with a secret (brig ends the TLS, substitutes, opens its
# own TLS upstream) and to a host without (CONNECT is a byte relay), alternating.
# The upstream is a Python TLS server on a loopback address of its own, port 443,
# with a certificate from a CA made here (given to brig with --egress-ca-file and
# to the client). Reports the median and p90 of each, N requests each.
# Usage: bench/egress_secrets.sh [path/to/brig]   (default: the release build)
set -euo pipefail
cd "$(dirname "$0")/.."
brig=$(realpath "${1:-target/x86_64-unknown-linux-gnu/release/brig}")
n=${N:-200}
ip=127.77.0.1
work=$(mktemp -d)
chmod 755 "$work"
server=
trap '[ -n "$server" ] && kill $server 2>/dev/null; rm -rf "$work"' EXIT
cd "$work"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key \
    -out ca.pem -days 2 -subj /CN=bench-upstream-ca 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout leaf.key \
    -out leaf.csr -subj /CN=api.test 2>/dev/null
printf 'subjectAltName=DNS:api.test,DNS:plain.test\n' >ext
openssl x509 -req -in leaf.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out leaf.pem \
    -days 2 -extfile ext 2>/dev/null
chmod 644 ca.pem
cat >server.py <<'PY'
import socket, ssl, sys, threading
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain("leaf.pem", "leaf.key")
s = socket.socket(); s.bind((sys.argv[1], 443)); s.listen(1024)
print("ready", flush=True)
def serve(c):
    try:
        # Else Nagle holds the close_notify behind the response for a delayed ACK.
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        t = ctx.wrap_socket(c, server_side=True)
        head = b""
        while b"\r\n\r\n" not in head:
            d = t.recv(65536)
            if not d:
                return
            head += d
        t.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        t.unwrap()
    except (OSError, ssl.SSLError):
        pass
    finally:
        c.close()
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
PY
cat >client.py <<'PY'
import os, socket, ssl, statistics, sys, time
n = int(sys.argv[1])
ctx = ssl.create_default_context()  # SSL_CERT_FILE: the host's roots and brig's CA
ctx.load_verify_locations("/bench-ca.pem")
token = os.environ["TOKEN"].encode()
def get(host, auth):
    t = time.perf_counter()
    s = socket.create_connection(("127.0.0.1", 3128))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(b"CONNECT %s:443 HTTP/1.1\r\nHost: %s:443\r\n\r\n" % (host, host))
    r = b""
    while b"\r\n\r\n" not in r:
        r += s.recv(4096)
    assert b" 200 " in r.split(b"\r\n")[0], r
    c = ctx.wrap_socket(s, server_hostname=host.decode())
    c.sendall(b"GET / HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n\r\n" % (host, auth))
    data = b""
    while True:
        try:
            d = c.recv(65536)
        except (ssl.SSLError, OSError):
            break
        if not d:
            break
        data += d
    c.close()
    assert data.startswith(b"HTTP/1.1 200"), data
    return time.perf_counter() - t
times = {b"api.test": [], b"plain.test": []}
# The first request to each: brig makes api.test's leaf certificate on first use.
first = {host: get(host, token if host == b"api.test" else b"x") for host in times}
for _ in range(n):
    times[b"api.test"].append(get(b"api.test", token))
    times[b"plain.test"].append(get(b"plain.test", b"not-a-secret"))
for host, label in ((b"plain.test", "relayed (no secret)"), (b"api.test", "intercepted (secret)")):
    t = times[host]
    print("%-22s median %.2f ms, p90 %.2f ms, first %.2f ms" % (label,
          statistics.median(t) * 1e3, statistics.quantiles(t, n=10)[8] * 1e3, first[host] * 1e3))
PY
/usr/bin/python3 server.py "$ip" >ready &
server=$!
while [ ! -s ready ]; do sleep 0.1; done
echo "$ip api.test plain.test" >hosts
TOKEN=bench-secret-value "$brig" run --network allow --allow-host api.test \
    --allow-host plain.test --egress-hosts hosts --egress-allow-private 127.0.0.0/8 \
    --secret TOKEN@api.test --egress-ca-file ca.pem --bind "$work/ca.pem:/bench-ca.pem" \
    --bind "$work/client.py:/bench-client.py" --cpus none --timeout 600s \
    -- /usr/bin/python3 /bench-client.py "$n"
