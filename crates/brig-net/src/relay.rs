//! The common path of every proxied connection: the per-sandbox cap, the
//! handshake deadline, the byte copy (`copy_bidirectional`: no per-byte work; with
//! a bandwidth cap, through `throttle`), and
//! the record of what happened (a log line and an [`EgressEvent`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};

use crate::Shared;

/// Which of brig's listeners a connection came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// The HTTP proxy: absolute-form plain HTTP.
    Http,
    /// The HTTP proxy: CONNECT.
    Connect,
    Socks,
    /// Transparent capture of TCP to a synthetic address.
    Capture,
    Dns,
}

impl Via {
    pub fn as_str(self) -> &'static str {
        match self {
            Via::Http => "http",
            Via::Connect => "connect",
            Via::Socks => "socks5",
            Via::Capture => "capture",
            Via::Dns => "dns",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Allowed,
    Refused,
}

/// One connection (or DNS question), for audit.
#[derive(Debug, Clone)]
pub struct EgressEvent {
    pub via: Via,
    /// As the client named it (a name, an IP; empty when it never said).
    pub host: String,
    /// 0 for a DNS question.
    pub port: u16,
    /// The address connected to, or the one that was refused.
    pub addr: Option<SocketAddr>,
    pub decision: Decision,
    /// A short code: `allowed`, or why not (`not_allowed`, `forbidden_range`, ...;
    /// `secret_exfiltration`: a secret's placeholder was sent toward a host that
    /// secret may not reach).
    pub reason: String,
    /// With `secret_exfiltration`: the secret's name (never its value).
    pub secret: Option<String>,
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub duration: Duration,
}

/// Called for every event; the daemon audits through it.
pub type EventSink = Arc<dyn Fn(&EgressEvent) + Send + Sync>;

pub(crate) fn record(shared: &Shared, event: EgressEvent) {
    let addr = event.addr.map(|a| a.to_string()).unwrap_or_default();
    tracing::info!(
        via = event.via.as_str(),
        host = %event.host,
        port = event.port,
        addr = %addr,
        decision = ?event.decision,
        reason = %event.reason,
        secret = event.secret.as_deref().unwrap_or(""),
        bytes_up = event.bytes_up,
        bytes_down = event.bytes_down,
        duration_ms = event.duration.as_millis() as u64,
        "egress"
    );
    if let Some(sink) = &shared.events {
        sink(&event);
    }
}

/// An event under construction.
pub(crate) struct Pending {
    pub via: Via,
    pub host: String,
    pub port: u16,
    pub addr: Option<SocketAddr>,
    pub started: Instant,
    /// Bytes brig sent upstream itself before the copy (a rewritten request head).
    pub sent_up: u64,
}

impl Pending {
    pub fn new(via: Via) -> Pending {
        Pending {
            via,
            host: String::new(),
            port: 0,
            addr: None,
            started: Instant::now(),
            sent_up: 0,
        }
    }

    pub fn refused(self, shared: &Shared, reason: &str) {
        self.finish(shared, Decision::Refused, reason, 0, 0);
    }

    /// A refusal that names the secret it protected.
    pub fn refused_for(self, shared: &Shared, reason: &str, secret: Option<String>) {
        if let Some(secret) = &secret {
            tracing::warn!(
                "egress: refused a request to {}:{} carrying the placeholder of secret {secret}: an attempted exfiltration",
                self.host,
                self.port
            );
        }
        self.record(shared, Decision::Refused, reason, (0, 0), secret);
    }

    pub fn finish(self, shared: &Shared, decision: Decision, reason: &str, up: u64, down: u64) {
        self.record(shared, decision, reason, (up, down), None);
    }

    fn record(
        self,
        shared: &Shared,
        decision: Decision,
        reason: &str,
        (up, down): (u64, u64),
        secret: Option<String>,
    ) {
        record(
            shared,
            EgressEvent {
                via: self.via,
                host: self.host,
                port: self.port,
                addr: self.addr,
                decision,
                reason: reason.to_string(),
                secret,
                bytes_up: up + self.sent_up,
                bytes_down: down,
                duration: self.started.elapsed(),
            },
        );
    }
}

/// Bytes copied per read, each way. tokio's default (8 KiB) made four times the
/// system calls for the same bytes (bench/egress.sh).
const COPY_BUFFER: usize = 64 * 1024;

/// Copies both ways until both sides are done, then records the connection.
pub(crate) async fn splice<C, U>(shared: &Shared, event: Pending, client: &mut C, mut upstream: U)
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let copied = match &shared.bandwidth {
        None => {
            tokio::io::copy_bidirectional_with_sizes(
                client,
                &mut upstream,
                COPY_BUFFER,
                COPY_BUFFER,
            )
            .await
        }
        Some((up, down)) => {
            let mut client = crate::throttle::Throttled::new(client, up.clone());
            let mut upstream = crate::throttle::Throttled::new(upstream, down.clone());
            tokio::io::copy_bidirectional_with_sizes(
                &mut client,
                &mut upstream,
                COPY_BUFFER,
                COPY_BUFFER,
            )
            .await
        }
    };
    match copied {
        Ok((up, down)) => event.finish(shared, Decision::Allowed, "allowed", up, down),
        // The byte counts of a broken copy are lost with it; the connection was allowed.
        Err(_) => event.finish(
            shared,
            Decision::Allowed,
            "allowed, ended by an error",
            0,
            0,
        ),
    }
}

/// Accepts on `listener` for the life of the runtime; each connection holds one of
/// the sandbox's slots from accept to close.
pub(crate) async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, via: Via) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // EMFILE and the like: back off instead of spinning.
                tracing::warn!("egress {}: accept: {e}", via.as_str());
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let slot = shared.slots.clone().try_acquire_owned();
        let shared = shared.clone();
        tokio::spawn(async move {
            let Ok(_slot) = slot else {
                let mut pending = Pending::new(via);
                pending.host = "-".into();
                over_cap(stream, via, shared.limits.max_connections).await;
                pending.refused(&shared, "too_many_connections");
                return;
            };
            match via {
                Via::Http | Via::Connect => crate::http::handle(&shared, stream).await,
                Via::Socks => crate::socks::handle(&shared, stream).await,
                Via::Capture => crate::capture::handle(&shared, stream).await,
                Via::Dns => {}
            }
        });
    }
}

/// Tells an over-cap client why, where the protocol has room for it.
async fn over_cap(mut stream: TcpStream, via: Via, cap: usize) {
    over_cap_reply(&mut stream, via, cap).await;
    close_gently(stream).await;
}

async fn over_cap_reply(stream: &mut TcpStream, via: Via, cap: usize) {
    use tokio::io::AsyncWriteExt;
    let message = format!(
        "brig egress refused the connection: this sandbox already has {cap} connections open (the cap); close some and retry"
    );
    let _ = match via {
        Via::Http | Via::Connect => {
            let response = crate::http::response(503, "Service Unavailable", &message);
            tokio::time::timeout(Duration::from_secs(1), stream.write_all(&response)).await
        }
        // SOCKS5 general failure, after a greeting we do not wait for.
        Via::Socks => {
            tokio::time::timeout(Duration::from_secs(1), stream.write_all(&[5, 0xff])).await
        }
        Via::Capture | Via::Dns => Ok(Ok(())),
    };
}

/// After the client was told its tunnel is open: on port 443 to a name, the TLS
/// ClientHello must name that host (or none); then the bytes flow, or, for a
/// secret's host, brig ends the TLS itself (`mitm`).
pub(crate) async fn tunnel<C>(
    shared: &Shared,
    event: Pending,
    client: &mut C,
    mut upstream: TcpStream,
    name: Option<&str>,
    port: u16,
) where
    C: AsyncRead + AsyncWrite + Unpin,
{
    use tokio::io::AsyncWriteExt;
    if let (Some(name), 443) = (name, port) {
        let expected = brig_policy::net::normalize_name(name).unwrap_or_default();
        let read = tokio::time::timeout(shared.limits.handshake, crate::tls::read_hello(client));
        let (record, hello) = match read.await {
            Ok(Ok(read)) => read,
            Ok(Err(_)) | Err(_) => return event.refused(shared, "no_client_hello"),
        };
        let refusal = match hello {
            crate::tls::Hello::Sni(sni) if sni != expected => {
                tracing::info!("egress: TLS to {name}:443 named {sni}: refused");
                Some("sni_mismatch")
            }
            crate::tls::Hello::NotTls => Some("not_tls_on_443"),
            _ => None,
        };
        if let Some(reason) = refusal {
            drop(upstream);
            event.refused(shared, reason);
            return close_gently(client).await;
        }
        if crate::mitm::intercepts(shared, name) {
            return crate::mitm::intercept(shared, event, client, record, upstream, name).await;
        }
        if upstream.write_all(&record).await.is_err() {
            return event.finish(shared, Decision::Allowed, "allowed, upstream closed", 0, 0);
        }
    }
    splice(shared, event, client, upstream).await;
}

/// Ends a refused client's connection with a FIN after what was written, then
/// discards what it still sends for a moment (at most 64 KiB, 1 s): closing with
/// unread bytes would reset the connection and could lose the reply.
pub(crate) async fn close_gently<S>(mut stream: S)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = stream.shutdown().await;
    let drain = async {
        let mut buf = [0u8; 4096];
        let mut left = 64 * 1024usize;
        while left > 0 {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
}
