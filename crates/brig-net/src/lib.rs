//! brig's egress proxy: the only way out of a sandbox's network namespace.
//!
//! brig creates the listening sockets inside the sandbox's namespace (see
//! `brig_jail::net`) and this crate serves them from outside it, in brig's own
//! namespace. Every connection is decided by the sandbox's
//! [`brig_policy::net::EgressPolicy`]:
//!
//! | module | concern |
//! |---|---|
//! | `resolve` | the proxy's own resolver (system, or a hosts file) |
//! | `synth` | synthetic addresses the DNS resolver hands out, mapped back to names |
//! | `dial` | policy, resolution, the check of every address, the connect |
//! | `http` | the HTTP proxy: absolute-form plain HTTP and CONNECT |
//! | `socks` | SOCKS5 CONNECT |
//! | `dns` | the DNS resolver at the sandbox's resolv.conf address |
//! | `capture` | TCP redirected to brig inside the namespace (no proxy variables) |
//! | `tls` | the SNI of a TLS ClientHello |
//! | `relay` | the byte copy, the caps, the log line and the event |
//! | `secrets` | placeholders, and their values put into requests toward their hosts |
//! | `ca` | the CA of TLS interception and the leaf certificates it issues |
//! | `mitm` | TLS interception, for secrets' hosts only |

pub mod ca;
mod capture;
mod dial;
mod dns;
mod http;
mod mitm;
mod relay;
pub mod resolve;
pub mod secrets;
mod socks;
pub mod synth;
mod throttle;
pub mod tls;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use brig_policy::net::{EgressPolicy, Refusal};

pub use ca::Ca;
pub use relay::{Decision, EgressEvent, EventSink, Via};
pub use resolve::Resolver;
pub use secrets::{Secret, SecretError};

/// Where brig's listeners are inside a sandbox's namespace.
pub mod layout {
    use super::*;
    /// The HTTP proxy (`HTTP_PROXY`, `HTTPS_PROXY`).
    pub const HTTP: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 3128);
    /// The SOCKS5 proxy (`ALL_PROXY`).
    pub const SOCKS: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 1080);
    /// The DNS resolver /etc/resolv.conf names.
    pub const DNS: SocketAddrV4 = SocketAddrV4::new(brig_policy::EGRESS_DNS, 53);
    /// Where TCP to a synthetic address is redirected.
    pub const CAPTURE: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 15001);
    /// Synthetic addresses: each allowed name the resolver answers gets one.
    pub const SYNTHETIC: (Ipv4Addr, u8) = (Ipv4Addr::new(198, 18, 0, 0), 15);
}

/// The proxy variables a sandbox with egress gets (upper and lower case).
pub fn proxy_env() -> BTreeMap<String, String> {
    let http = format!("http://{}", layout::HTTP);
    let socks = format!("socks5h://{}", layout::SOCKS);
    let no_proxy = "localhost,127.0.0.1,::1".to_string();
    let mut env = BTreeMap::new();
    for (key, value) in [
        ("HTTP_PROXY", &http),
        ("HTTPS_PROXY", &http),
        ("ALL_PROXY", &socks),
        ("NO_PROXY", &no_proxy),
    ] {
        env.insert(key.to_string(), value.clone());
        env.insert(key.to_ascii_lowercase(), value.clone());
    }
    env
}

/// Where the sandbox finds the CA bundle that holds brig's CA (with the root's own).
pub const CA_BUNDLE: &str = brig_policy::net::CA_BUNDLE;

/// The variables that point TLS clients at [`CA_BUNDLE`], for a sandbox whose TLS
/// brig intercepts (OpenSSL, Python requests, Node, pip).
pub fn ca_env() -> BTreeMap<String, String> {
    [
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS",
        "PIP_CERT",
        "CURL_CA_BUNDLE",
    ]
    .iter()
    .map(|key| (key.to_string(), CA_BUNDLE.to_string()))
    .collect()
}

/// A sandbox's secrets and what interception needs. Empty by default.
#[derive(Debug, Default)]
pub struct Secrets {
    /// Each appears in the sandbox as its placeholder only.
    pub list: Vec<Secret>,
    /// Issues certificates for the secrets' hosts; without it no TLS is
    /// intercepted and secrets reach plain HTTP only.
    pub ca: Option<Arc<Ca>>,
    /// Roots trusted for intercepted upstreams besides the web's (an operator's
    /// internal CA; tests).
    pub upstream_roots: Vec<ca::CertificateDer>,
}

/// Limits of one sandbox's proxy.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections open at once, handshakes included; past it a new one is refused.
    pub max_connections: usize,
    /// How long a client has to send its request (head, SOCKS greeting, ClientHello).
    pub handshake: Duration,
    /// How long connecting to an upstream address may take.
    pub connect: Duration,
    /// Bytes per second each way, shared by all the sandbox's connections (with a
    /// burst of one second's worth); `None`: no cap.
    pub bytes_per_second: Option<u64>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 256,
            handshake: Duration::from_secs(10),
            connect: Duration::from_secs(10),
            bytes_per_second: None,
        }
    }
}

/// Everything one sandbox's proxy needs.
pub struct Egress {
    pub policy: EgressPolicy,
    pub resolver: Resolver,
    pub limits: Limits,
    pub events: Option<EventSink>,
    pub secrets: Secrets,
}

/// The sockets made in the sandbox's namespace, as `brig_jail::net::Listen` lists them.
pub struct Sockets {
    pub http: OwnedFd,
    pub socks: OwnedFd,
    pub dns: OwnedFd,
    pub capture: Option<OwnedFd>,
}

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("cannot serve a socket made in the sandbox: {0}")]
    Socket(std::io::Error),
    #[error("cannot read hosts file {path}: {source}")]
    HostsFile {
        path: String,
        source: std::io::Error,
    },
    #[error("egress TLS: {0}")]
    Tls(String),
    #[error("the host's resolver: {0}")]
    Resolver(String),
    #[error(transparent)]
    Secret(#[from] SecretError),
    #[error("hosts file {path}, line {line}: {reason}")]
    HostsLine {
        path: String,
        line: usize,
        reason: String,
    },
}

/// A sandbox's policy that its owner can replace while the proxy serves: each
/// connection and DNS question reads the one in force when it is decided, so a
/// change applies to new connections and leaves open ones alone. An optional
/// `bound` (an operator's upper limit) is checked too: a connection goes out only
/// if both allow it.
#[derive(Clone)]
pub struct LivePolicy(Arc<std::sync::RwLock<Arc<Layers>>>);

/// A policy and its bound.
type Layers = (EgressPolicy, Option<EgressPolicy>);

impl LivePolicy {
    pub fn new(policy: EgressPolicy, bound: Option<EgressPolicy>) -> LivePolicy {
        LivePolicy(Arc::new(std::sync::RwLock::new(Arc::new((policy, bound)))))
    }

    /// Replaces the policy and its bound together.
    pub fn replace(&self, policy: EgressPolicy, bound: Option<EgressPolicy>) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new((policy, bound));
    }

    fn now(&self) -> Arc<Layers> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// [`EgressPolicy::check_name`] of the policy, then of the bound.
    pub fn check_name(&self, name: &str, port: Option<u16>) -> Result<String, Refusal> {
        let now = self.now();
        let name = now.0.check_name(name, port)?;
        match &now.1 {
            Some(bound) => bound.check_name(&name, port).map_err(bounded),
            None => Ok(name),
        }
    }

    /// [`EgressPolicy::check`] of the policy, then of the bound.
    pub fn check(&self, name: Option<&str>, addr: IpAddr, port: u16) -> Result<(), Refusal> {
        let now = self.now();
        now.0.check(name, addr, port)?;
        match &now.1 {
            Some(bound) => bound.check(name, addr, port).map_err(bounded),
            None => Ok(()),
        }
    }
}

/// A refusal by the operator's bound says so, so the model does not retry with
/// another session policy.
fn bounded(refusal: Refusal) -> Refusal {
    match refusal {
        Refusal::NotAllowed { allowed } => Refusal::Denied {
            rule: format!(
                "the operator's bound for this tenant, which allows only {}",
                if allowed.is_empty() {
                    "nothing".to_string()
                } else {
                    allowed.join(", ")
                }
            ),
        },
        Refusal::Offline => Refusal::Denied {
            rule: "the operator's bound for this tenant, which allows no network".into(),
        },
        other => other,
    }
}

/// [`Egress`] with a [`LivePolicy`], for [`spawn_live`].
pub struct LiveEgress {
    pub policy: LivePolicy,
    pub resolver: Resolver,
    pub limits: Limits,
    pub events: Option<EventSink>,
    pub secrets: Secrets,
}

/// The listeners of one sandbox as [`spawn_live`] serves them: dropping it closes
/// them (connections already relayed keep going until they end).
pub struct Serving(Vec<tokio::task::AbortHandle>);

impl Drop for Serving {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Shared by every listener of one sandbox.
pub(crate) struct Shared {
    pub policy: LivePolicy,
    pub resolver: Resolver,
    pub limits: Limits,
    pub events: Option<EventSink>,
    pub synth: synth::Synthetic,
    pub slots: Arc<tokio::sync::Semaphore>,
    pub secrets: Vec<Secret>,
    pub tls: Option<Interception>,
    /// With [`Limits::bytes_per_second`]: the buckets up and down.
    pub bandwidth: Option<(Arc<throttle::Bucket>, Arc<throttle::Bucket>)>,
}

/// The two sides of intercepted TLS.
pub(crate) struct Interception {
    pub ca: Arc<Ca>,
    pub upstream: Arc<rustls::ClientConfig>,
}

/// Serves `sockets` on `runtime` until the runtime ends (or the sockets close).
/// Must be called with the runtime entered or from its handle.
pub fn spawn(
    runtime: &tokio::runtime::Handle,
    egress: Egress,
    sockets: Sockets,
) -> Result<(), NetError> {
    let live = LiveEgress {
        policy: LivePolicy::new(egress.policy, None),
        resolver: egress.resolver,
        limits: egress.limits,
        events: egress.events,
        secrets: egress.secrets,
    };
    // Served for the life of the runtime.
    std::mem::forget(spawn_live(runtime, live, sockets)?);
    Ok(())
}

/// Serves `sockets` on `runtime` until the returned [`Serving`] is dropped, with a
/// policy the caller can replace meanwhile.
pub fn spawn_live(
    runtime: &tokio::runtime::Handle,
    egress: LiveEgress,
    sockets: Sockets,
) -> Result<Serving, NetError> {
    let _guard = runtime.enter();
    secrets::check_unique(&egress.secrets.list)?;
    let tls = match egress.secrets.ca {
        Some(ca) => Some(Interception {
            ca,
            upstream: Arc::new(
                mitm::client_config(&egress.secrets.upstream_roots).map_err(NetError::Tls)?,
            ),
        }),
        None => None,
    };
    let shared = Arc::new(Shared {
        secrets: egress.secrets.list,
        tls,
        slots: Arc::new(tokio::sync::Semaphore::new(egress.limits.max_connections)),
        policy: egress.policy,
        resolver: egress.resolver,
        limits: egress.limits,
        events: egress.events,
        synth: synth::Synthetic::new(layout::SYNTHETIC),
        bandwidth: egress
            .limits
            .bytes_per_second
            .map(|rate| (throttle::Bucket::new(rate), throttle::Bucket::new(rate))),
    });
    let tcp = |fd: OwnedFd| {
        tokio::net::TcpListener::from_std(std::net::TcpListener::from(fd)).map_err(NetError::Socket)
    };
    let http = tcp(sockets.http)?;
    let socks = tcp(sockets.socks)?;
    let dns = tokio::net::UdpSocket::from_std(std::net::UdpSocket::from(sockets.dns))
        .map_err(NetError::Socket)?;
    let capture = sockets.capture.map(tcp).transpose()?;
    let mut tasks = vec![
        runtime.spawn(relay::accept_loop(http, shared.clone(), Via::Http)),
        runtime.spawn(relay::accept_loop(socks, shared.clone(), Via::Socks)),
    ];
    if let Some(capture) = capture {
        tasks.push(runtime.spawn(relay::accept_loop(capture, shared.clone(), Via::Capture)));
    }
    tasks.push(runtime.spawn(dns::serve(dns, shared)));
    Ok(Serving(tasks.iter().map(|t| t.abort_handle()).collect()))
}

#[cfg(test)]
mod live_tests {
    use super::*;
    use brig_policy::net::EgressMode;

    fn policy(mode: EgressMode, allow: &[&str]) -> EgressPolicy {
        EgressPolicy {
            mode,
            allow: allow.iter().map(|r| r.parse().unwrap()).collect(),
            ..EgressPolicy::default()
        }
    }

    const PUBLIC: IpAddr = IpAddr::V4(Ipv4Addr::new(93, 184, 216, 34));

    #[test]
    fn a_connection_needs_both_the_policy_and_the_bound() {
        let live = LivePolicy::new(
            policy(EgressMode::Open, &[]),
            Some(policy(EgressMode::Allow, &["a.test"])),
        );
        assert!(live.check(Some("a.test"), PUBLIC, 443).is_ok());
        let refused = live.check(Some("b.test"), PUBLIC, 443).unwrap_err();
        assert!(
            refused.message("b.test", 443).contains("bound"),
            "{refused:?}"
        );
        assert!(live.check_name("b.test", Some(443)).is_err());
        assert!(live.check_name("a.test", None).is_ok());
    }

    #[test]
    fn a_replaced_policy_decides_from_then_on() {
        let live = LivePolicy::new(policy(EgressMode::Allow, &["a.test"]), None);
        let held = live.clone();
        assert!(held.check(Some("a.test"), PUBLIC, 80).is_ok());
        live.replace(policy(EgressMode::Allow, &["b.test"]), None);
        assert!(held.check(Some("a.test"), PUBLIC, 80).is_err());
        assert!(held.check(Some("b.test"), PUBLIC, 80).is_ok());
        live.replace(
            policy(EgressMode::Open, &[]),
            Some(policy(EgressMode::None, &[])),
        );
        assert!(held.check(Some("b.test"), PUBLIC, 80).is_err());
    }
}
