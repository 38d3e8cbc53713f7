#!/usr/bin/env python3
"""Checks a live `brig serve` against its own OpenAPI document.

    openapi_conformance.py URL ADMIN_KEY

Makes one of each kind of request (sessions, exec and its stream, files and
archives, processes and their streams, snapshots, volumes, tenants, keys, stored
files, execute and its stream, audit, metrics), successes and typical refusals,
and checks each exchange against the document the daemon serves: the status is
documented (an error may fall to `default`), the content type is one the response
lists, a JSON body matches the response's schema, and a JSON request that succeeded
matches the request body's schema. Every operation of the document must be tried:
a new route without a request here fails the check. Deletes what it made. Prints
the mismatches and exits 1 if there are any. Needs `jsonschema` (scripts/test.sh
puts it in target/test-venv).
"""

import http.client
import json
import re
import sys
import urllib.parse

from jsonschema import Draft202012Validator

url, key = sys.argv[1], sys.argv[2]
parts = urllib.parse.urlsplit(url)
c = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
c.request("GET", "/v1/openapi.json")
doc = json.loads(c.getresponse().read())
problems = []
exercised = set()


def template_of(method, path):
    p = path.split("?")[0]
    for t, ops in doc["paths"].items():
        if re.match("^" + re.sub(r"\{[^}]+\}", "[^/]+", t) + "$", p) and method.lower() in ops:
            return t
    raise SystemExit(f"{method} {path}: no such route in the document")


def schema_errors(schema, value):
    validator = Draft202012Validator({"components": doc["components"], **schema})
    return [f"{e.message[:200]} at {list(e.absolute_path)}" for e in validator.iter_errors(value)]


def call(method, path, body=None, raw=None, ctype="application/json"):
    headers = {"Authorization": f"Bearer {key}"}
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    if data is not None:
        headers["Content-Type"] = ctype
    c.request(method, path, body=data, headers=headers)
    r = c.getresponse()
    out = r.read()
    t = template_of(method, path)
    exercised.add((method.lower(), t))
    op = doc["paths"][t][method.lower()]
    request_schema = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
    if request_schema and body is not None and r.status < 300:
        for e in schema_errors(request_schema, body):
            problems.append(f"{method} {t} request {body}: {e}")
    response = op["responses"].get(str(r.status))
    if response is None and r.status >= 400:
        response = op["responses"].get("default")
    if response is None:
        problems.append(f"{method} {t}: status {r.status} not documented: {out[:150]!r}")
        return r.status, out
    ctype_out = r.getheader("content-type", "").split(";")[0]
    content = response.get("content", {})
    if content and out and ctype_out not in content:
        problems.append(f"{method} {t} {r.status}: content type {ctype_out} not in {list(content)}")
    schema = content.get(ctype_out, {}).get("schema")
    if schema and ctype_out == "application/json":
        for e in schema_errors(schema, json.loads(out)):
            problems.append(f"{method} {t} {r.status}: {e}")
    return r.status, out


def j(raw):
    return json.loads(raw)


st, out = call("POST", "/v1/sessions", {"ttl_seconds": 600, "env": {"A": "b"}, "metadata": {"user": "u1"}, "limits": {"cpus": 0.5, "memory": "256M", "pids": 64}})
sid = j(out)["session_id"]
st, out = call("POST", "/v1/sessions", {"limits": {"cpus": "1.5", "disk": 100000000}})
call("DELETE", f"/v1/sessions/{j(out)['session_id']}")
call("GET", f"/v1/sessions/{sid}")
call("GET", "/v1/sessions")
call("GET", "/v1/sessions?metadata=user%3Du1&metadata=chat%3Dc1")
call("GET", "/v1/sessions?metadata=nokey")
call("PATCH", f"/v1/sessions/{sid}", {"ttl_seconds": 1200, "idle_timeout_seconds": 0, "metadata": {"user": "u1", "chat": "c1"}})
call("PATCH", f"/v1/sessions/{sid}", {})
call("GET", f"/v1/sessions/{sid}/stats")
call("GET", "/v1/sessions/ses_nope/stats")
call("PATCH", "/v1/sessions/ses_nope", {"ttl_seconds": 60})
call("POST", f"/v1/sessions/{sid}/exec", {"argv": ["echo", "hi"]})
call("POST", f"/v1/sessions/{sid}/exec", {"cmd": "exit 3"})
call("POST", f"/v1/sessions/{sid}/exec", {"argv": ["nope-not-here"]})
call("POST", f"/v1/sessions/{sid}/exec", {"argv": ["sleep", "5"], "timeout_ms": 100})
call("POST", f"/v1/sessions/{sid}/exec", {"argv": 5})
call("POST", f"/v1/sessions/{sid}/bash", {"cmd": "echo hi"})
call("PUT", f"/v1/sessions/{sid}/files?path=/workspace/a.txt", raw=b"hello", ctype="application/octet-stream")
call("GET", f"/v1/sessions/{sid}/files?path=/workspace/a.txt")
call("GET", f"/v1/sessions/{sid}/files?path=/workspace/none")
call("GET", f"/v1/sessions/{sid}/dir?path=/workspace")
call("POST", f"/v1/sessions/{sid}/dir?path=/workspace/d")
call("DELETE", f"/v1/sessions/{sid}/files?path=/workspace/d")
st, out = call("POST", f"/v1/sessions/{sid}/processes", {"argv": ["sh", "-c", "cat; echo done"]})
pid = j(out)["process_id"]
call("GET", f"/v1/sessions/{sid}/processes")
call("GET", f"/v1/sessions/{sid}/processes/{pid}")
call("POST", f"/v1/sessions/{sid}/processes/{pid}/stdin?close=true", raw=b"x\n", ctype="application/octet-stream")
call("POST", f"/v1/sessions/{sid}/processes/{pid}/wait?timeout_ms=5000")
call("GET", f"/v1/sessions/{sid}/processes/{pid}/output")
call("GET", f"/v1/sessions/{sid}/processes/{pid}/stream")
call("POST", f"/v1/sessions/{sid}/exec/stream", {"argv": ["echo", "hi"]})
st, tar = call("GET", f"/v1/sessions/{sid}/archive?path=/workspace")
call("PUT", f"/v1/sessions/{sid}/archive?path=/workspace/copy", raw=tar, ctype="application/x-tar")
call("POST", f"/v1/sessions/{sid}/processes/{pid}/signal", {"signal": "TERM"})
call("POST", f"/v1/sessions/{sid}/processes/999/signal", {"signal": "TERM"})
st, out = call("POST", f"/v1/sessions/{sid}/processes", {"argv": ["sleep", "30"]})
call("POST", f"/v1/sessions/{sid}/processes/{j(out)['process_id']}/signal", {"signal": 9})
call("POST", f"/v1/sessions/{sid}/code", {"code": "x = 40\nx + 2"})
call("POST", f"/v1/sessions/{sid}/code", {"code": "1/0", "timeout_ms": 5000})
call("POST", f"/v1/sessions/{sid}/code", {"code": "print('hi')", "stream": True})
call("POST", f"/v1/sessions/{sid}/code", {"code": "1", "context_id": "ctx_nope"})
st, out = call("POST", f"/v1/sessions/{sid}/contexts", {"cwd": "/tmp"})
ctx = j(out)["id"]
call("GET", f"/v1/sessions/{sid}/contexts")
call("POST", f"/v1/sessions/{sid}/contexts/{ctx}/restart")
call("DELETE", f"/v1/sessions/{sid}/contexts/{ctx}")
call("DELETE", f"/v1/sessions/{sid}/contexts/{ctx}")
call("POST", f"/v1/sessions/{sid}/pause")
call("POST", f"/v1/sessions/{sid}/exec", {"argv": ["true"]})
call("POST", f"/v1/sessions/{sid}/resume")
st, out = call("POST", f"/v1/sessions/{sid}/snapshots", {"name": "s1"})
snap = j(out)["snapshot_id"]
call("GET", "/v1/snapshots")
call("GET", f"/v1/snapshots/{snap}")
call("POST", f"/v1/sessions/{sid}/restore", {"snapshot_id": snap})
st, out = call("POST", "/v1/sessions", {"snapshot": snap})
fork = j(out)["session_id"]
st, out = call("POST", "/v1/sessions", {"volume": "v1", "volume_size": "64M"})
vs = j(out)["session_id"]
call("GET", "/v1/volumes")
call("DELETE", f"/v1/sessions/{vs}")
call("PATCH", "/v1/volumes/v1", {"capacity": "128M"})
call("PATCH", "/v1/volumes/v1", {"capacity": "1M"})
call("DELETE", "/v1/volumes/v1")
call("GET", "/v1/tenants")
call("GET", "/v1/tenants/admin")
call("GET", "/v1/tenants/nobody")
call("PUT", "/v1/tenants/admin/quotas", {"max_sessions": 50})
st, out = call("POST", "/v1/keys", {"tenant": "t1", "name": "k"})
kid = j(out)["key_id"]
call("GET", "/v1/keys")
call("DELETE", f"/v1/keys/{kid}")
st, out = call("POST", "/v1/files", raw=b"--XX\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.txt\"\r\n\r\nhello\r\n--XX--\r\n", ctype="multipart/form-data; boundary=XX")
fid = j(out)["file_id"]
call("GET", "/v1/files")
call("GET", f"/v1/files/{fid}")
call("POST", "/v1/execute", {"code": "print(1)\n1+1", "files": [{"path": "in.txt", "file_id": fid}]})
call("POST", "/v1/execute", {"code": "x", "timeout_ms": 10**9})
call("POST", "/v1/execute/stream", {"code": "print(1)"})
call("DELETE", f"/v1/files/{fid}")
call("GET", "/v1/audit?limit=5")
call("GET", "/v1/audit?format=jsonl&limit=2")
call("GET", "/v1/sessions/nope")
call("DELETE", f"/v1/snapshots/{snap}")
call("DELETE", f"/v1/sessions/{fork}")
call("DELETE", f"/v1/snapshots/{snap}")
call("DELETE", f"/v1/sessions/{sid}")
call("GET", "/health")
call("GET", "/metrics")
call("GET", "/v1/openapi.json")

for t, ops in doc["paths"].items():
    for method in ops:
        if (method, t) not in exercised:
            problems.append(f"{method.upper()} {t}: never tried (add it here)")
print("\n".join(problems) or "every exchange matches the document")
sys.exit(1 if problems else 0)
