//! The HTTP proxy: CONNECT, and plain HTTP in absolute form
//! (`GET http://host/path`). One request per connection: the request goes upstream
//! with `Connection: close` and its Host header set to the URL's host, then bytes
//! flow both ways (to that one checked address only, whatever the client sends next).

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::dial::{dial, Failure, Host};
use crate::relay::{close_gently, splice, tunnel, Pending, Via};
use crate::Shared;

const MAX_HEAD: usize = 64 * 1024;

/// A complete response with a one-line text body.
pub(crate) fn response(code: u16, reason: &str, message: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n\
         X-Brig-Egress: refused\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{message}\n",
        message.len() + 1
    )
    .into_bytes()
}

/// Reads until the end of the request head; returns the buffer and the head's length.
pub(crate) async fn read_head<S: AsyncRead + Unpin>(
    stream: &mut S,
) -> Result<(Vec<u8>, usize), &'static str> {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).await.map_err(|_| "read failed")?;
        if n == 0 {
            return Err("closed before a request");
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 128];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf) {
            Ok(httparse::Status::Complete(len)) => return Ok((buf, len)),
            Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => continue,
            Ok(httparse::Status::Partial) => return Err("request head too large"),
            Err(_) => return Err("not an HTTP request"),
        }
    }
}

/// `host[:port]` with a default port; IPv6 in brackets.
fn split_authority(authority: &str, default_port: u16) -> Option<(String, u16)> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = match after {
            "" => default_port,
            p => p.strip_prefix(':')?.parse().ok()?,
        };
        (format!("[{host}]"), port)
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host.to_string(), port.parse().ok()?),
            None => (authority.to_string(), default_port),
        }
    };
    if host.is_empty() || port == 0 || host.contains('@') {
        return None;
    }
    Some((host, port))
}

/// A request refused before it went anywhere: the answer and what to record.
pub(crate) struct Refusal {
    pub response: Vec<u8>,
    pub code: &'static str,
    /// The secret whose placeholder was sent where it may not go.
    pub secret: Option<String>,
}

impl Refusal {
    fn leak(leak: crate::secrets::Leak) -> Refusal {
        Refusal {
            response: response(403, "Forbidden", &leak.message()),
            code: "secret_exfiltration",
            secret: Some(leak.secret),
        }
    }
}

/// Hop-by-hop headers brig does not pass on (it sets `Connection: close` itself).
fn hop_by_hop(name: &str) -> bool {
    name.eq_ignore_ascii_case("connection")
        || name.eq_ignore_ascii_case("proxy-connection")
        || name.eq_ignore_ascii_case("proxy-authorization")
        || name.eq_ignore_ascii_case("keep-alive")
}

/// An intercepted request (origin form, inside TLS to `name`), as it goes upstream:
/// its head with `Connection: close` and the secrets for `name`, then `body`.
/// Its Host must be `name`: the value must not reach another site the same
/// server (a CDN) also answers for.
pub(crate) fn origin_request(
    shared: &Shared,
    name: &str,
    head: &[u8],
    body: &[u8],
) -> Result<Vec<u8>, Refusal> {
    let mut headers = [httparse::EMPTY_HEADER; 128];
    let mut req = httparse::Request::new(&mut headers);
    let bad = |why: &str| Refusal {
        response: response(400, "Bad Request", &format!("brig egress: {why}")),
        code: "protocol_error",
        secret: None,
    };
    if !matches!(req.parse(head), Ok(httparse::Status::Complete(_))) {
        return Err(bad("not an HTTP/1.1 request"));
    }
    let method = req.method.unwrap_or("");
    let path = req.path.unwrap_or("");
    let mut bytes = format!("{method} {path} HTTP/1.1\r\n").into_bytes();
    for h in req.headers.iter() {
        if hop_by_hop(h.name) {
            continue;
        }
        if h.name.eq_ignore_ascii_case("host") {
            let given = std::str::from_utf8(h.value).unwrap_or("");
            let host = split_authority(given, 443).map(|(host, _)| host);
            let same = host
                .as_deref()
                .and_then(|h| brig_policy::net::normalize_name(h).ok())
                == brig_policy::net::normalize_name(name).ok();
            if !same {
                return Err(Refusal {
                    response: response(
                        403,
                        "Forbidden",
                        &format!("brig egress: this connection is to {name}; a request for Host {given:?} must open its own"),
                    ),
                    code: "host_mismatch",
                    secret: None,
                });
            }
        }
        bytes.extend_from_slice(h.name.as_bytes());
        bytes.extend_from_slice(b": ");
        bytes.extend_from_slice(h.value);
        bytes.extend_from_slice(b"\r\n");
    }
    bytes.extend_from_slice(b"Connection: close\r\n\r\n");
    let mut bytes = match crate::secrets::rewrite_head(&shared.secrets, name, &bytes, body) {
        Ok(rewritten) => rewritten.unwrap_or(bytes),
        Err(leak) => return Err(Refusal::leak(leak)),
    };
    bytes.extend_from_slice(body);
    Ok(bytes)
}

/// Answers `response` and closes, recording the refusal as `code`.
async fn refuse(
    shared: &Shared,
    event: Pending,
    mut stream: TcpStream,
    (status, reason, message): (u16, &str, &str),
    code: &str,
) {
    let _ = stream.write_all(&response(status, reason, message)).await;
    event.refused(shared, code);
    close_gently(stream).await;
}

pub(crate) async fn handle(shared: &Shared, mut stream: TcpStream) {
    let mut event = Pending::new(Via::Http);
    let head = tokio::time::timeout(shared.limits.handshake, read_head(&mut stream)).await;
    let (buf, head_len) = match head {
        Ok(Ok(read)) => read,
        Ok(Err(why)) => {
            let message = format!("brig egress: {why}: this is an HTTP proxy (use CONNECT host:port, or GET http://host/path)");
            return refuse(
                shared,
                event,
                stream,
                (400, "Bad Request", &message),
                "protocol_error",
            )
            .await;
        }
        Err(_) => {
            return refuse(
                shared,
                event,
                stream,
                (
                    408,
                    "Request Timeout",
                    "brig egress: no complete request in time",
                ),
                "protocol_error",
            )
            .await;
        }
    };
    let mut headers = [httparse::EMPTY_HEADER; 128];
    let mut req = httparse::Request::new(&mut headers);
    let _ = req.parse(&buf);
    let method = req.method.unwrap_or("").to_string();
    let target = req.path.unwrap_or("").to_string();

    let bad = |why: &str| format!("brig egress: {why}");
    let (host, port, rewritten) = if method == "CONNECT" {
        event.via = Via::Connect;
        match split_authority(&target, 443) {
            Some(_) if buf.len() > head_len => {
                let why = "send the tunnel's bytes after the 200 reply, not with the CONNECT";
                return refuse(
                    shared,
                    event,
                    stream,
                    (400, "Bad Request", &bad(why)),
                    "protocol_error",
                )
                .await;
            }
            Some((host, port)) if !target.contains('/') => (host, port, None),
            _ => {
                return refuse(
                    shared,
                    event,
                    stream,
                    (400, "Bad Request", &bad("CONNECT wants host:port")),
                    "protocol_error",
                )
                .await;
            }
        }
    } else {
        let Some(rest) = target.strip_prefix("http://").or_else(|| {
            target
                .get(..7)
                .filter(|s| s.eq_ignore_ascii_case("http://"))
                .map(|_| &target[7..])
        }) else {
            let why = if target.to_ascii_lowercase().starts_with("https://") {
                "https URLs go through CONNECT (set HTTPS_PROXY)"
            } else {
                "a proxy request needs an absolute http:// URL"
            };
            return refuse(
                shared,
                event,
                stream,
                (400, "Bad Request", &bad(why)),
                "protocol_error",
            )
            .await;
        };
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) if rest.as_bytes()[i] == b'/' => (&rest[..i], rest[i..].to_string()),
            Some(i) => (&rest[..i], format!("/{}", &rest[i..])),
            None => (rest, "/".to_string()),
        };
        let Some((host, port)) = split_authority(authority, 80) else {
            return refuse(
                shared,
                event,
                stream,
                (400, "Bad Request", &bad("bad host in the URL")),
                "protocol_error",
            )
            .await;
        };
        let host_header = if port == 80 {
            host.clone()
        } else {
            format!("{host}:{port}")
        };
        let mut bytes = format!("{method} {path} HTTP/1.1\r\nHost: {host_header}\r\n").into_bytes();
        for h in req.headers.iter() {
            if hop_by_hop(h.name) || h.name.eq_ignore_ascii_case("host") {
                continue;
            }
            // Values as sent: they need not be UTF-8.
            bytes.extend_from_slice(h.name.as_bytes());
            bytes.extend_from_slice(b": ");
            bytes.extend_from_slice(h.value);
            bytes.extend_from_slice(b"\r\n");
        }
        bytes.extend_from_slice(b"Connection: close\r\n\r\n");
        (host, port, Some(bytes))
    };
    event.host = host.clone();
    event.port = port;
    let parsed = Host::parse(&host);
    let name = crate::dial::named(shared, &parsed).unwrap_or_default();
    let shown = name.clone().unwrap_or_else(|| host.clone());
    // Plain HTTP: the secrets for this host go into the head; a placeholder for
    // another host, in the head or the body read so far, stops the request here.
    let rewritten = match rewritten {
        Some(head) => {
            let body = &buf[head_len..];
            match crate::secrets::rewrite_head(&shared.secrets, &shown, &head, body) {
                Ok(new) => {
                    let mut bytes = new.unwrap_or(head);
                    bytes.extend_from_slice(body);
                    Some(bytes)
                }
                Err(leak) => {
                    let refusal = Refusal::leak(leak);
                    let _ = stream.write_all(&refusal.response).await;
                    event.refused_for(shared, refusal.code, refusal.secret);
                    return close_gently(stream).await;
                }
            }
        }
        None => None,
    };
    let (upstream, addr) = match dial(shared, &parsed, port).await {
        Ok(ok) => ok,
        Err((failure, addr)) => {
            event.addr = addr.map(|a| std::net::SocketAddr::new(a, port));
            let (code, reason) = match failure {
                Failure::Refused(_) => (403, "Forbidden"),
                Failure::Unresolved(_) | Failure::Unreachable(_) => (502, "Bad Gateway"),
            };
            let message = failure.message(&shown, port);
            return refuse(
                shared,
                event,
                stream,
                (code, reason, &message),
                failure.code(),
            )
            .await;
        }
    };
    event.addr = Some(addr);
    match rewritten {
        None => {
            let established = b"HTTP/1.1 200 Connection established\r\n\r\n";
            if stream.write_all(established).await.is_err() {
                return event.refused(shared, "client_gone");
            }
            tunnel(shared, event, &mut stream, upstream, name.as_deref(), port).await;
        }
        Some(request) => {
            let mut upstream = upstream;
            if upstream.write_all(&request).await.is_err() {
                let message = bad("the upstream closed");
                let answer = (502, "Bad Gateway", message.as_str());
                return refuse(shared, event, stream, answer, "unreachable").await;
            }
            event.sent_up = request.len() as u64;
            splice(shared, event, &mut stream, upstream).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorities_split_into_host_and_port() {
        assert_eq!(split_authority("a.test", 80), Some(("a.test".into(), 80)));
        assert_eq!(
            split_authority("a.test:8080", 80),
            Some(("a.test".into(), 8080))
        );
        assert_eq!(
            split_authority("[::1]:443", 80),
            Some(("[::1]".into(), 443))
        );
        assert_eq!(split_authority("[::1]", 80), Some(("[::1]".into(), 80)));
        assert_eq!(split_authority("a.test:0", 80), None);
        assert_eq!(split_authority("a.test:x", 80), None);
        assert_eq!(split_authority("user@a.test", 80), None);
        assert_eq!(split_authority(":80", 80), None);
    }
}
