//! From what a client asked for to a connected upstream socket: the policy on the
//! name, the proxy's own resolution, the check of every resolved address, and a
//! connect to an address that was checked (no second lookup, so DNS rebinding
//! gains nothing).

use std::net::{IpAddr, SocketAddr};

use brig_policy::net::Refusal;
use tokio::net::TcpStream;

use crate::Shared;

/// What a client asked to reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    Name(String),
    Ip(IpAddr),
}

impl Host {
    /// A host as a client wrote it: a name, an IP, or `[v6]`.
    pub fn parse(text: &str) -> Host {
        let bare = text
            .strip_prefix('[')
            .and_then(|t| t.strip_suffix(']'))
            .unwrap_or(text);
        match bare.parse::<IpAddr>() {
            Ok(ip) => Host::Ip(ip),
            Err(_) => Host::Name(text.to_string()),
        }
    }
}

impl std::fmt::Display for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
            Host::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// Why no upstream connection was made.
#[derive(Debug, Clone)]
pub enum Failure {
    /// The policy said no.
    Refused(Refusal),
    /// Allowed, but the name has no address.
    Unresolved(String),
    /// Allowed, but no address answered.
    Unreachable(String),
}

impl Failure {
    pub fn code(&self) -> &'static str {
        match self {
            Failure::Refused(r) => r.code(),
            Failure::Unresolved(_) => "unresolved",
            Failure::Unreachable(_) => "unreachable",
        }
    }

    /// One line for the client (and the model reading it).
    pub fn message(&self, host: &str, port: u16) -> String {
        match self {
            Failure::Refused(r) => r.message(host, port),
            Failure::Unresolved(why) => format!("brig egress: {host}:{port} is allowed, but {why}"),
            Failure::Unreachable(why) => {
                format!("brig egress: {host}:{port} is allowed, but connecting failed: {why}")
            }
        }
    }
}

/// The name a connection is for, once synthetic addresses are mapped back.
pub fn named(shared: &Shared, host: &Host) -> Result<Option<String>, Failure> {
    match host {
        Host::Name(name) => Ok(Some(name.clone())),
        Host::Ip(ip) if shared.synth.covers(*ip) => match shared.synth.name_of(*ip) {
            Some(name) => Ok(Some(name)),
            None => Err(Failure::Refused(Refusal::Forbidden {
                range: "synthetic (198.18.0.0/15) range no name was given",
            })),
        },
        Host::Ip(_) => Ok(None),
    }
}

/// Decides and connects. Returns the stream and the address it reached.
pub async fn dial(
    shared: &Shared,
    host: &Host,
    port: u16,
) -> Result<(TcpStream, SocketAddr), (Failure, Option<IpAddr>)> {
    let name = named(shared, host).map_err(|f| (f, None))?;
    let addrs = match (&name, host) {
        (Some(name), _) => {
            let name = shared
                .policy
                .check_name(name, Some(port))
                .map_err(|r| (Failure::Refused(r), None))?;
            shared
                .resolver
                .lookup(&name)
                .await
                .map_err(|why| (Failure::Unresolved(why), None))?
        }
        (None, Host::Ip(ip)) => vec![*ip],
        (None, Host::Name(_)) => unreachable!("a name is named"),
    };
    // Every address, not just the first: a name that resolves partly into a
    // forbidden range is refused as a whole.
    for addr in &addrs {
        shared
            .policy
            .check(name.as_deref(), *addr, port)
            .map_err(|r| (Failure::Refused(r), Some(*addr)))?;
    }
    let mut last = String::from("no address");
    for addr in &addrs {
        let target = SocketAddr::new(brig_policy::net::canonical(*addr), port);
        match tokio::time::timeout(shared.limits.connect, TcpStream::connect(target)).await {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                return Ok((stream, target));
            }
            Ok(Err(e)) => last = format!("{target}: {e}"),
            Err(_) => last = format!("{target}: timed out"),
        }
    }
    Err((Failure::Unreachable(last), addrs.first().copied()))
}
