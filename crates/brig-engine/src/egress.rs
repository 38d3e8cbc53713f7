//! Sessions' egress: the `network` object of a session, the operator's options
//! (hosts file, opened private ranges, the default policy, tenants' bounds), and
//! each session's proxy, served by brig-net on the daemon's runtime from sockets
//! bound inside the session's network namespace.
//!
//! A session created with a way out (its effective mode not `none`) is started
//! with brig's resolv.conf and proxy variables and gets listeners after launch;
//! one created without keeps today's sandbox exactly. While the daemon is down the
//! listeners are gone with it, and the namespace has only `lo`: nothing leaves.
//! Every connection is an audit event (`egress.connect`; DNS answers
//! `egress.dns`), written in batches by one task, never by the relay.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use brig_policy::net::{Cidr, EgressMode, EgressPolicy, HostRule};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::backend::Sandbox;
use crate::db::{now_rfc3339, NewAuditEvent};
use crate::fault::Error as ApiError;
use crate::state::AppState;

/// A session's `network` (and a tenant's `network_bound`), as the API has it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Network {
    /// `none`, `allow` or `open`.
    pub mode: String,
    /// `PATTERN[:PORTS]`: `example.com`, `*.example.com`, an IP or a CIDR.
    pub allow: Vec<String>,
    pub deny: Vec<String>,
}

impl Default for Network {
    fn default() -> Network {
        Network {
            mode: EgressMode::None.to_string(),
            allow: Vec::new(),
            deny: Vec::new(),
        }
    }
}

impl Network {
    /// The policy it says, with the operator's opened ranges; 400 `invalid` naming
    /// the first bad mode, pattern, port list or CIDR.
    pub fn policy(&self, allow_private: &[Cidr]) -> Result<EgressPolicy, ApiError> {
        let bad = |e: brig_policy::net::NetPolicyError| ApiError::invalid(format!("network: {e}"));
        let rules = |texts: &[String]| -> Result<Vec<HostRule>, ApiError> {
            texts.iter().map(|t| t.parse().map_err(bad)).collect()
        };
        let policy = EgressPolicy {
            mode: self.mode.parse().map_err(bad)?,
            allow: rules(&self.allow)?,
            deny: rules(&self.deny)?,
            allow_private: allow_private.to_vec(),
        };
        policy.validate().map_err(|_| {
            ApiError::invalid(format!(
                "network: allow rules need mode \"allow\" (the mode is \"{}\")",
                policy.mode
            ))
        })?;
        Ok(policy)
    }

    /// As the daemon shows and stores it: each rule in its canonical form.
    pub fn normalized(&self) -> Result<Network, ApiError> {
        let policy = self.policy(&[])?;
        Ok(Network {
            mode: policy.mode.to_string(),
            allow: policy.allow.iter().map(ToString::to_string).collect(),
            deny: policy.deny.iter().map(ToString::to_string).collect(),
        })
    }

    pub fn is_none(&self) -> bool {
        self.mode == "none"
    }
}

fn rank(mode: EgressMode) -> u8 {
    match mode {
        EgressMode::None => 0,
        EgressMode::Allow => 1,
        EgressMode::Open => 2,
    }
}

/// A session may not ask for a wider mode than its tenant's bound (403
/// `forbidden`, saying the bound). Within the mode, every connection is checked
/// against both, so the bound's rules hold whatever the session's say.
pub fn check_within(
    tenant: &str,
    session: &EgressPolicy,
    bound: Option<&EgressPolicy>,
) -> Result<(), ApiError> {
    let Some(bound) = bound else { return Ok(()) };
    if rank(session.mode) > rank(bound.mode) {
        return Err(ApiError::forbidden(format!(
            "network mode \"{}\" is wider than tenant {tenant}'s bound (mode \"{}\"{}): ask for \
             that mode or narrower",
            session.mode,
            bound.mode,
            if bound.allow.is_empty() {
                String::new()
            } else {
                format!(
                    ", allowing {}",
                    bound
                        .allow
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        )));
    }
    Ok(())
}

/// The policy of `network` for a session of `tenant`, and the tenant's bound (both
/// with the operator's opened ranges): 400 for a bad policy, 403 for a mode wider
/// than the bound.
pub fn policies(
    state: &crate::state::Shared,
    tenant: &str,
    network: &Network,
) -> Result<(EgressPolicy, Option<EgressPolicy>), ApiError> {
    let opened = &state.egress.allow_private;
    let policy = network.policy(opened)?;
    let bound = state
        .auth
        .network_bound(tenant)
        .map(|b| b.policy(opened))
        .transpose()?;
    check_within(tenant, &policy, bound.as_ref())?;
    Ok((policy, bound))
}

/// Makes `spec` a sandbox with a way out: brig's resolv.conf and the proxy
/// variables (a session's own `env` still wins over them).
pub fn offer(spec: &mut brig_policy::SandboxSpec) {
    spec.network = brig_policy::NetworkMode::Egress;
    for (key, value) in brig_net::proxy_env() {
        spec.env.entry(key).or_insert(value);
    }
}

/// The daemon's egress settings and the audit channel of every session's proxy.
pub struct Egress {
    resolver: brig_net::Resolver,
    pub allow_private: Vec<Cidr>,
    /// For sessions that do not ask (`--session-network`).
    pub default: Network,
    /// Each session's bandwidth cap (`--egress-rate`).
    rate: Option<u64>,
    events: mpsc::Sender<NewAuditEvent>,
    /// The CA of TLS interception for sessions' secrets, kept in the data dir
    /// (0600) and loaded at the first session with secrets.
    ca_path: std::path::PathBuf,
    ca: Mutex<Option<Arc<brig_net::Ca>>>,
    /// Roots trusted for intercepted upstreams besides the web's
    /// (`--egress-ca-file`).
    upstream_roots: Vec<brig_net::ca::CertificateDer>,
    /// Taken by the writer ([`spawn_writer`]).
    pending: Mutex<Option<mpsc::Receiver<NewAuditEvent>>>,
}

/// Events waiting for the writer; past it a connection's event is dropped (and
/// counted) rather than holding up the relay.
const QUEUE: usize = 16 * 1024;
/// Events written in one transaction at most.
const BATCH: usize = 512;

impl Egress {
    pub fn new(config: &crate::Config) -> anyhow::Result<Egress> {
        let resolver = match &config.egress_hosts {
            Some(path) => brig_net::Resolver::from_hosts_file(path)?,
            None => brig_net::Resolver::system()?,
        };
        let default = config.session_network.normalized().map_err(|e| {
            anyhow::anyhow!(
                "--session-network: {}",
                e.message.trim_start_matches("network: ")
            )
        })?;
        let upstream_roots = match &config.egress_ca_file {
            Some(path) => brig_net::ca::load_certificates(path)
                .map_err(|e| anyhow::anyhow!("--egress-ca-file: {e}"))?,
            None => Vec::new(),
        };
        let (events, pending) = mpsc::channel(QUEUE);
        Ok(Egress {
            resolver,
            allow_private: config.egress_allow_private.clone(),
            default,
            rate: config.egress_rate,
            events,
            ca_path: config.data_dir.join(CA_FILE),
            ca: Mutex::new(None),
            upstream_roots,
            pending: Mutex::new(Some(pending)),
        })
    }
}

/// The daemon's CA (key and certificate) in its data dir.
pub const CA_FILE: &str = "egress-ca.pem";

impl Egress {
    /// The daemon's CA, loaded (or made) at the first need.
    pub fn ca(&self) -> Result<Arc<brig_net::Ca>, ApiError> {
        let mut ca = self.ca.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(ca) = &*ca {
            return Ok(ca.clone());
        }
        let loaded =
            Arc::new(brig_net::Ca::load_or_create(&self.ca_path).map_err(ApiError::internal)?);
        *ca = Some(loaded.clone());
        Ok(loaded)
    }
}

/// Writes the proxies' events to the audit log, in batches, for the life of the
/// runtime.
pub fn spawn_writer(state: &AppState) {
    let Some(mut pending) = state
        .egress
        .pending
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
    else {
        return;
    };
    let db = state.db.clone();
    tokio::spawn(async move {
        let mut batch = Vec::with_capacity(BATCH);
        while pending.recv_many(&mut batch, BATCH).await > 0 {
            if let Err(e) = db.insert_audits(std::mem::take(&mut batch)).await {
                tracing::warn!("cannot write egress audit events: {}", e.message);
            }
        }
    });
}

/// A session's proxy: its policy, replaceable, and its listeners, closed when
/// dropped.
pub struct Proxy {
    live: brig_net::LivePolicy,
    _serving: brig_net::Serving,
}

impl Proxy {
    /// The policy for new connections from now on.
    pub fn replace(&self, policy: EgressPolicy, bound: Option<EgressPolicy>) {
        self.live.replace(policy, bound);
    }
}

/// Whether the host has what transparent capture needs (iproute2, nftables).
fn can_capture() -> bool {
    static CAN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *CAN.get_or_init(|| {
        let found = ["ip", "nft"].iter().all(|tool| {
            ["/usr/sbin", "/usr/bin", "/sbin", "/bin"]
                .iter()
                .any(|dir| std::path::Path::new(dir).join(tool).is_file())
        });
        if !found {
            tracing::warn!(
                "egress: 'ip' or 'nft' not found: no transparent capture, only programs that use the proxy variables get out"
            );
        }
        found
    })
}

/// Binds the session's listeners in `sandbox`'s network namespace and serves them.
/// `first`: the sandbox was just started (the capture rules are made; a restarted
/// daemon finds them in place).
pub async fn attach(
    state: &AppState,
    tenant: &str,
    session_id: &str,
    sandbox: &Arc<dyn Sandbox>,
    (policy, bound): (EgressPolicy, Option<EgressPolicy>),
    secrets: &[crate::secrets::SessionSecret],
    first: bool,
) -> Result<Proxy, ApiError> {
    use brig_jail::net::{Capture, Listen};
    use brig_net::layout;
    let secrets = if secrets.is_empty() {
        brig_net::Secrets::default()
    } else {
        brig_net::Secrets {
            list: secrets
                .iter()
                .map(crate::secrets::SessionSecret::to_net)
                .collect::<Result<_, _>>()?,
            ca: Some(state.egress.ca()?),
            upstream_roots: state.egress.upstream_roots.clone(),
        }
    };
    let capture = can_capture();
    let mut listen = vec![
        Listen::Tcp(layout::HTTP),
        Listen::Tcp(layout::SOCKS),
        Listen::Udp(layout::DNS),
    ];
    if capture {
        listen.push(Listen::Tcp(layout::CAPTURE));
    }
    let rules = (capture && first).then_some(Capture {
        range: layout::SYNTHETIC,
        to_port: layout::CAPTURE.port(),
    });
    let bind = sandbox.clone();
    let fds = tokio::task::spawn_blocking(move || bind.bind_net(&listen, rules))
        .await
        .map_err(ApiError::internal)?
        .map_err(|e| ApiError::internal(format!("egress for session {session_id}: {e}")))?;
    let mut fds = fds.into_iter();
    let mut next = || {
        fds.next()
            .ok_or_else(|| ApiError::internal("a listener is missing"))
    };
    let sockets = brig_net::Sockets {
        http: next()?,
        socks: next()?,
        dns: next()?,
        capture: if capture { Some(next()?) } else { None },
    };
    let live = brig_net::LivePolicy::new(policy, bound);
    let egress = brig_net::LiveEgress {
        policy: live.clone(),
        resolver: state.egress.resolver.clone(),
        limits: brig_net::Limits {
            bytes_per_second: state.egress.rate,
            ..brig_net::Limits::default()
        },
        events: Some(sink(state, tenant, session_id)),
        secrets,
    };
    let serving = brig_net::spawn_live(&tokio::runtime::Handle::current(), egress, sockets)
        .map_err(ApiError::internal)?;
    Ok(Proxy {
        live,
        _serving: serving,
    })
}

/// What a session's proxy does with each event: counts it and queues it for the
/// audit writer, without waiting.
fn sink(state: &AppState, tenant: &str, session_id: &str) -> brig_net::EventSink {
    let events = state.egress.events.clone();
    let (tenant, session_id) = (tenant.to_string(), session_id.to_string());
    Arc::new(move |event: &brig_net::EgressEvent| {
        let dns = event.via == brig_net::Via::Dns;
        if !dns {
            crate::metrics::egress_connection(
                event.decision == brig_net::Decision::Allowed,
                event.bytes_up,
                event.bytes_down,
            );
        }
        let record = audit_event(&tenant, &session_id, event);
        if events.try_send(record).is_err() {
            crate::metrics::failure("egress_audit_dropped");
        }
    })
}

/// An [`brig_net::EgressEvent`] as an audit event.
pub fn audit_event(tenant: &str, session_id: &str, event: &brig_net::EgressEvent) -> NewAuditEvent {
    let allowed = event.decision == brig_net::Decision::Allowed;
    let action = if event.via == brig_net::Via::Dns {
        "egress.dns"
    } else {
        "egress.connect"
    };
    let address = event
        .addr
        .map(|a: SocketAddr| a.ip())
        .map(|ip: IpAddr| ip.to_string());
    NewAuditEvent {
        time: now_rfc3339(),
        tenant: tenant.to_string(),
        key_id: None,
        frontend: crate::auth::Frontend::Daemon.as_str(),
        session_id: Some(session_id.to_string()),
        action: action.to_string(),
        detail: serde_json::json!({
            "via": event.via.as_str(),
            "host": crate::audit::bounded(&event.host, 256),
            "port": event.port,
            "address": address,
            "decision": if allowed { "allowed" } else { "refused" },
            "reason": event.reason,
            // With `secret_exfiltration`: the secret's name, never its value.
            "secret": event.secret,
            "bytes_up": event.bytes_up,
            "bytes_down": event.bytes_down,
            "duration_ms": duration_ms(event.duration),
        }),
        outcome: if allowed { "ok" } else { "refused" }.to_string(),
    }
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn network(mode: &str, allow: &[&str], deny: &[&str]) -> Network {
        Network {
            mode: mode.into(),
            allow: allow.iter().map(|s| s.to_string()).collect(),
            deny: deny.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn a_bad_pattern_port_or_mode_is_refused_by_name() {
        for (bad, named) in [
            (network("allow", &["exa mple.com"], &[]), "exa mple.com"),
            (
                network("allow", &["example.com:99999"], &[]),
                "example.com:99999",
            ),
            (network("allow", &["10.0.0.0/99"], &[]), "10.0.0.0/99"),
            (network("wide", &[], &[]), "wide"),
            (network("open", &[], &["*.x.org:0"]), "*.x.org:0"),
        ] {
            let err = bad.policy(&[]).unwrap_err();
            assert_eq!(err.code.as_str(), "invalid_request");
            assert!(err.message.contains(named), "{named}: {}", err.message);
        }
        let err = network("open", &["example.com"], &[])
            .policy(&[])
            .unwrap_err();
        assert!(err.message.contains("allow"), "{}", err.message);
    }

    #[test]
    fn rules_are_shown_in_their_canonical_form() {
        let n = network(
            "allow",
            &["Example.COM", "*.x.org:443,8000-8100"],
            &["10.0.0.0/8"],
        );
        let shown = n.normalized().unwrap();
        assert_eq!(shown.allow[0], "example.com");
        assert_eq!(shown.normalized().unwrap(), shown);
        assert!(Network::default().is_none());
    }

    #[test]
    fn a_tenant_bound_refuses_a_wider_mode_and_admits_a_narrower_one() {
        let bound = network("allow", &["example.com"], &[]).policy(&[]).unwrap();
        let open = network("open", &[], &[]).policy(&[]).unwrap();
        let allow = network("allow", &["other.org"], &[]).policy(&[]).unwrap();
        let none = Network::default().policy(&[]).unwrap();
        let err = check_within("t1", &open, Some(&bound)).unwrap_err();
        assert_eq!(err.code.as_str(), "forbidden");
        assert!(err.message.contains("t1") && err.message.contains("example.com"));
        check_within("t1", &allow, Some(&bound)).unwrap();
        check_within("t1", &none, Some(&bound)).unwrap();
        check_within("t1", &open, None).unwrap();
    }

    #[test]
    fn a_connection_becomes_an_audit_event_with_its_numbers() {
        let event = brig_net::EgressEvent {
            via: brig_net::Via::Connect,
            host: "example.com".into(),
            port: 443,
            addr: Some("93.184.216.34:443".parse().unwrap()),
            decision: brig_net::Decision::Allowed,
            reason: "allowed".into(),
            secret: None,
            bytes_up: 10,
            bytes_down: 20,
            duration: Duration::from_millis(7),
        };
        let row = audit_event("t1", "ses_1", &event);
        assert_eq!(row.action, "egress.connect");
        assert_eq!(row.frontend, "daemon");
        assert_eq!(row.detail["address"], "93.184.216.34");
        assert_eq!(row.detail["bytes_down"], 20);
        assert_eq!(row.detail["decision"], "allowed");
        assert_eq!(row.detail["duration_ms"], 7);
    }
}
