//! Egress policy: which hosts and ports a sandbox may reach through brig's proxy.
//!
//! Pure data and pure decisions. A policy is a mode (`none`, `allow`, `open`),
//! allow and deny rules (`PATTERN[:PORTS]`, PATTERN being `example.com`,
//! `*.example.com`, an IP or a CIDR), and the private ranges an operator opted in.
//! Whatever the mode, an address in a [`FORBIDDEN_RANGES`] range (loopback,
//! private, link-local and cloud metadata, CGNAT, multicast, ...) is refused unless
//! an opted-in CIDR covers it. Deny wins over allow. Names are ASCII only: a
//! non-ASCII name is refused rather than guessed at (write IDNA names in their
//! `xn--` form).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Where a sandbox whose TLS brig intercepts finds the CA bundle that holds brig's
/// CA (see `Filesystem::extra_ca`); its TLS variables point here.
pub const CA_BUNDLE: &str = "/etc/brig/ca-bundle.crt";

/// What a sandbox may reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum EgressMode {
    /// Loopback only: no way out at all.
    #[default]
    None,
    /// Only the hosts and ports of the allow rules.
    Allow,
    /// Any public address.
    Open,
}

impl FromStr for EgressMode {
    type Err = NetPolicyError;
    fn from_str(text: &str) -> Result<Self, NetPolicyError> {
        match text {
            "none" => Ok(EgressMode::None),
            "allow" => Ok(EgressMode::Allow),
            "open" => Ok(EgressMode::Open),
            other => Err(NetPolicyError::BadMode(other.to_string())),
        }
    }
}

impl fmt::Display for EgressMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EgressMode::None => "none",
            EgressMode::Allow => "allow",
            EgressMode::Open => "open",
        })
    }
}

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum NetPolicyError {
    #[error("invalid network mode '{0}': use none, allow or open")]
    BadMode(String),
    #[error("invalid host pattern '{0}': use example.com, *.example.com, an IP or a CIDR, optionally with :PORTS (e.g. example.com:443, [::1]:80)")]
    BadPattern(String),
    #[error("invalid host name in '{0}': names are ASCII letters, digits, '-' and '_' in dot-separated labels (write international names in their xn-- form)")]
    BadName(String),
    #[error("invalid ports in '{0}': use 443, 80,443 or 8000-9000 (1-65535)")]
    BadPorts(String),
    #[error("invalid CIDR '{0}': use ADDRESS/PREFIX (e.g. 10.1.0.0/16, fd00::/8)")]
    BadCidr(String),
    #[error("'--allow-host' needs '--network allow' (the mode is {0})")]
    RulesNeedAllowMode(EgressMode),
}

/// An address range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// A range whose host bits are already clear (the constants below).
    const fn v4(a: u8, b: u8, c: u8, d: u8, prefix: u8) -> Cidr {
        Cidr {
            addr: IpAddr::V4(Ipv4Addr::new(a, b, c, d)),
            prefix,
        }
    }

    const fn v6(segments: [u16; 8], prefix: u8) -> Cidr {
        let [a, b, c, d, e, f, g, h] = segments;
        Cidr {
            addr: IpAddr::V6(Ipv6Addr::new(a, b, c, d, e, f, g, h)),
            prefix,
        }
    }

    pub fn contains(&self, addr: IpAddr) -> bool {
        match (self.addr, canonical(addr)) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

impl FromStr for Cidr {
    type Err = NetPolicyError;
    fn from_str(text: &str) -> Result<Self, NetPolicyError> {
        let bad = || NetPolicyError::BadCidr(text.to_string());
        let (addr, prefix) = match text.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (text, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| bad())?;
        let addr = canonical(addr);
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && p.len() <= 3 => {
                p.parse::<u8>().map_err(|_| bad())?
            }
            Some(_) => return Err(bad()),
            None => max,
        };
        if prefix > max {
            return Err(bad());
        }
        // Stored with the host bits cleared, so equal ranges compare equal.
        let addr = match addr {
            IpAddr::V4(a) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
                IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask))
            }
            IpAddr::V6(a) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
                IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask))
            }
        };
        Ok(Cidr { addr, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl TryFrom<String> for Cidr {
    type Error = NetPolicyError;
    fn try_from(text: String) -> Result<Self, NetPolicyError> {
        text.parse()
    }
}

impl From<Cidr> for String {
    fn from(cidr: Cidr) -> String {
        cidr.to_string()
    }
}

/// An IPv4-mapped IPv6 address (`::ffff:10.0.0.1`) as the IPv4 address it is, so
/// that it meets the IPv4 rules.
pub fn canonical(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => addr,
        },
        v4 => v4,
    }
}

/// Ranges no sandbox reaches unless the operator opts them in
/// (`--egress-allow-private`): everything that is not a public unicast address, and
/// the IPv6 ranges that embed an IPv4 address (NAT64, 6to4, Teredo) which could
/// carry a private one.
pub const FORBIDDEN_RANGES: &[(Cidr, &str)] = &[
    (Cidr::v4(0, 0, 0, 0, 8), "'this network' (0.0.0.0/8)"),
    (Cidr::v4(10, 0, 0, 0, 8), "private (10.0.0.0/8)"),
    (
        Cidr::v4(100, 64, 0, 0, 10),
        "carrier-grade NAT (100.64.0.0/10)",
    ),
    (Cidr::v4(127, 0, 0, 0, 8), "loopback (127.0.0.0/8)"),
    (
        Cidr::v4(169, 254, 0, 0, 16),
        "link-local and cloud metadata (169.254.0.0/16)",
    ),
    (Cidr::v4(172, 16, 0, 0, 12), "private (172.16.0.0/12)"),
    (
        Cidr::v4(192, 0, 0, 0, 24),
        "IETF protocol assignments (192.0.0.0/24)",
    ),
    (Cidr::v4(192, 0, 2, 0, 24), "documentation (192.0.2.0/24)"),
    (Cidr::v4(192, 88, 99, 0, 24), "6to4 relay (192.88.99.0/24)"),
    (Cidr::v4(192, 168, 0, 0, 16), "private (192.168.0.0/16)"),
    (Cidr::v4(198, 18, 0, 0, 15), "benchmarking (198.18.0.0/15)"),
    (
        Cidr::v4(198, 51, 100, 0, 24),
        "documentation (198.51.100.0/24)",
    ),
    (
        Cidr::v4(203, 0, 113, 0, 24),
        "documentation (203.0.113.0/24)",
    ),
    (Cidr::v4(224, 0, 0, 0, 4), "multicast (224.0.0.0/4)"),
    (
        Cidr::v4(240, 0, 0, 0, 4),
        "reserved and broadcast (240.0.0.0/4)",
    ),
    (Cidr::v6([0, 0, 0, 0, 0, 0, 0, 1], 128), "loopback (::1)"),
    (
        Cidr::v6([0, 0, 0, 0, 0, 0, 0, 0], 96),
        "unspecified and IPv4-compatible (::/96)",
    ),
    (
        Cidr::v6([0, 0, 0, 0, 0, 0xffff, 0, 0], 96),
        "IPv4-mapped (::ffff:0:0/96)",
    ),
    (
        Cidr::v6([0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96),
        "NAT64 (64:ff9b::/96)",
    ),
    (
        Cidr::v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48),
        "local NAT64 (64:ff9b:1::/48)",
    ),
    (
        Cidr::v6([0x100, 0, 0, 0, 0, 0, 0, 0], 64),
        "discard (100::/64)",
    ),
    (
        Cidr::v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 32),
        "Teredo (2001::/32)",
    ),
    (
        Cidr::v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32),
        "documentation (2001:db8::/32)",
    ),
    (
        Cidr::v6([0x2002, 0, 0, 0, 0, 0, 0, 0], 16),
        "6to4 (2002::/16)",
    ),
    (
        Cidr::v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7),
        "unique local (fc00::/7)",
    ),
    (
        Cidr::v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10),
        "link-local (fe80::/10)",
    ),
    (
        Cidr::v6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10),
        "site-local (fec0::/10)",
    ),
    (
        Cidr::v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8),
        "multicast (ff00::/8)",
    ),
];

/// The forbidden range `addr` is in, described for a reader.
pub fn forbidden_range(addr: IpAddr) -> Option<&'static str> {
    let addr = canonical(addr);
    FORBIDDEN_RANGES
        .iter()
        .find(|(range, _)| range.contains(addr))
        .map(|(_, what)| *what)
}

/// Ports a rule covers; empty means every port.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PortSet(Vec<(u16, u16)>);

impl PortSet {
    pub fn any() -> PortSet {
        PortSet(Vec::new())
    }

    pub fn is_any(&self) -> bool {
        self.0.is_empty()
    }

    pub fn contains(&self, port: u16) -> bool {
        self.is_any() || self.0.iter().any(|&(lo, hi)| lo <= port && port <= hi)
    }

    fn parse(text: &str, whole: &str) -> Result<PortSet, NetPolicyError> {
        let bad = || NetPolicyError::BadPorts(whole.to_string());
        let port = |p: &str| -> Result<u16, NetPolicyError> {
            if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            match p.parse::<u16>() {
                Ok(0) | Err(_) => Err(bad()),
                Ok(n) => Ok(n),
            }
        };
        let mut ranges = Vec::new();
        for item in text.split(',') {
            let range = match item.split_once('-') {
                Some((lo, hi)) => (port(lo)?, port(hi)?),
                None => (port(item)?, port(item)?),
            };
            if range.0 > range.1 {
                return Err(bad());
            }
            ranges.push(range);
        }
        Ok(PortSet(ranges))
    }
}

impl fmt::Display for PortSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (lo, hi)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            if lo == hi {
                write!(f, "{lo}")?;
            } else {
                write!(f, "{lo}-{hi}")?;
            }
        }
        Ok(())
    }
}

/// What a rule matches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostPattern {
    /// This name exactly (normalised: lowercase, no trailing dot).
    Name(String),
    /// Names below this one (`*.example.com` holds `example.com`), not the name itself.
    Subdomains(String),
    /// Addresses in this range (a single IP is a full-length prefix).
    Range(Cidr),
}

impl HostPattern {
    fn matches(&self, name: Option<&str>, addr: Option<IpAddr>) -> bool {
        match (self, name, addr) {
            (HostPattern::Name(n), Some(name), _) => n == name,
            (HostPattern::Subdomains(suffix), Some(name), _) => name
                .strip_suffix(suffix.as_str())
                .and_then(|head| head.strip_suffix('.'))
                .is_some_and(|head| !head.is_empty()),
            (HostPattern::Range(range), _, Some(addr)) => range.contains(addr),
            _ => false,
        }
    }

    fn is_name(&self) -> bool {
        !matches!(self, HostPattern::Range(_))
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostPattern::Name(n) => f.write_str(n),
            HostPattern::Subdomains(s) => write!(f, "*.{s}"),
            HostPattern::Range(r) if r.prefix == 32 || r.prefix == 128 => {
                write!(f, "{}", r.addr)
            }
            HostPattern::Range(r) => write!(f, "{r}"),
        }
    }
}

/// A host pattern with the ports it covers: `PATTERN[:PORTS]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct HostRule {
    pub pattern: HostPattern,
    pub ports: PortSet,
}

impl HostRule {
    fn matches(&self, name: Option<&str>, addr: Option<IpAddr>, port: Option<u16>) -> bool {
        self.pattern.matches(name, addr) && port.is_none_or(|p| self.ports.contains(p))
    }
}

impl FromStr for HostRule {
    type Err = NetPolicyError;
    fn from_str(text: &str) -> Result<Self, NetPolicyError> {
        let bad = || NetPolicyError::BadPattern(text.to_string());
        // [v6 or v6/prefix]:ports, a bare IPv6 (two or more colons), or host[:ports].
        let (host, ports) = if let Some(rest) = text.strip_prefix('[') {
            let (host, after) = rest.split_once(']').ok_or_else(bad)?;
            match after {
                "" => (host, None),
                _ => (host, Some(after.strip_prefix(':').ok_or_else(bad)?)),
            }
        } else if text.matches(':').count() >= 2 {
            (text, None)
        } else {
            match text.split_once(':') {
                Some((host, ports)) => (host, Some(ports)),
                None => (text, None),
            }
        };
        if host.is_empty() {
            return Err(bad());
        }
        let ports = match ports {
            Some(p) => PortSet::parse(p, text)?,
            None => PortSet::any(),
        };
        let starts_like_address = host.contains(':')
            || host.contains('/')
            || host
                .split('.')
                .next_back()
                .is_some_and(|last| !last.is_empty() && last.bytes().all(|b| b.is_ascii_digit()));
        let pattern = if starts_like_address {
            HostPattern::Range(host.parse::<Cidr>().map_err(|_| match host.contains('/') {
                true => NetPolicyError::BadCidr(text.to_string()),
                false => bad(),
            })?)
        } else if let Some(suffix) = host.strip_prefix("*.") {
            HostPattern::Subdomains(
                normalize_name(suffix).map_err(|_| NetPolicyError::BadName(text.to_string()))?,
            )
        } else {
            HostPattern::Name(
                normalize_name(host).map_err(|_| NetPolicyError::BadName(text.to_string()))?,
            )
        };
        Ok(HostRule { pattern, ports })
    }
}

impl fmt::Display for HostRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v6 = matches!(&self.pattern, HostPattern::Range(r) if r.addr.is_ipv6());
        match (v6, self.ports.is_any()) {
            (_, true) => write!(f, "{}", self.pattern),
            (true, false) => write!(f, "[{}]:{}", self.pattern, self.ports),
            (false, false) => write!(f, "{}:{}", self.pattern, self.ports),
        }
    }
}

impl TryFrom<String> for HostRule {
    type Error = NetPolicyError;
    fn try_from(text: String) -> Result<Self, NetPolicyError> {
        text.parse()
    }
}

impl From<HostRule> for String {
    fn from(rule: HostRule) -> String {
        rule.to_string()
    }
}

/// A host name as rules compare it: ASCII lowercase without the trailing dot.
/// Non-ASCII names are refused (not converted): a lookalike must not match by
/// accident. Labels are 1-63 of letters, digits, '-' and '_', 253 bytes in all.
pub fn normalize_name(name: &str) -> Result<String, NetPolicyError> {
    let bad = || NetPolicyError::BadName(name.to_string());
    let trimmed = name.strip_suffix('.').unwrap_or(name);
    if trimmed.is_empty() || trimmed.len() > 253 || !trimmed.is_ascii() {
        return Err(bad());
    }
    for label in trimmed.split('.') {
        let ok = !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !ok {
            return Err(bad());
        }
    }
    // All digits in the last label is an address, never a name.
    if trimmed
        .rsplit('.')
        .next()
        .is_some_and(|last| last.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(bad());
    }
    Ok(trimmed.to_ascii_lowercase())
}

/// Why a connection was refused; [`Refusal::message`] says it for a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The mode is `none`.
    Offline,
    /// The address is in a range no sandbox reaches.
    Forbidden { range: &'static str },
    /// A deny rule matched.
    Denied { rule: String },
    /// Mode `allow` and no allow rule matched.
    NotAllowed { allowed: Vec<String> },
    /// The name is not a valid host name.
    BadName,
}

impl Refusal {
    /// A short code for logs and audit.
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::Offline => "offline",
            Refusal::Forbidden { .. } => "forbidden_range",
            Refusal::Denied { .. } => "denied",
            Refusal::NotAllowed { .. } => "not_allowed",
            Refusal::BadName => "bad_name",
        }
    }

    /// One line for the program (and the model) that asked: which host, why, and
    /// what is allowed.
    /// `port` 0 is a DNS question (no port).
    pub fn message(&self, host: &str, port: u16) -> String {
        let host = match port {
            0 => host.to_string(),
            _ => format!("{host}:{port}"),
        };
        match self {
            Refusal::Offline => {
                format!("brig egress refused {host}: this sandbox has no network (--network none)")
            }
            Refusal::Forbidden { range } => format!(
                "brig egress refused {host}: its address is in a {range} range, which sandboxes never reach (an operator can open a range with --egress-allow-private)"
            ),
            Refusal::Denied { rule } => {
                format!("brig egress refused {host}: the policy denies it (rule {rule})")
            }
            Refusal::NotAllowed { allowed } if allowed.is_empty() => format!(
                "brig egress refused {host}: not on the allow list, which is empty"
            ),
            Refusal::NotAllowed { allowed } => format!(
                "brig egress refused {host}: not on the allow list; allowed: {}",
                allowed.join(", ")
            ),
            Refusal::BadName => format!(
                "brig egress refused {host}: not a valid host name (ASCII only; use the xn-- form)"
            ),
        }
    }
}

/// A sandbox's egress policy.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EgressPolicy {
    pub mode: EgressMode,
    pub allow: Vec<HostRule>,
    pub deny: Vec<HostRule>,
    /// Forbidden ranges the operator opened (an internal mirror, a test's loopback).
    pub allow_private: Vec<Cidr>,
}

impl EgressPolicy {
    /// Allow rules make sense only in `allow` mode.
    pub fn validate(&self) -> Result<(), NetPolicyError> {
        if !self.allow.is_empty() && self.mode != EgressMode::Allow {
            return Err(NetPolicyError::RulesNeedAllowMode(self.mode));
        }
        Ok(())
    }

    /// Whether `name` may be looked up and tried at all (by the DNS resolver, and
    /// by the proxy before it resolves): not denied, and in `allow` mode covered by
    /// some rule, or possibly resolving into an allowed range. `port` is `None` for
    /// a DNS query.
    pub fn check_name(&self, name: &str, port: Option<u16>) -> Result<String, Refusal> {
        let name = normalize_name(name).map_err(|_| Refusal::BadName)?;
        if self.mode == EgressMode::None {
            return Err(Refusal::Offline);
        }
        // A DNS query (no port) is refused only by a deny rule for every port.
        if let Some(rule) = self.deny.iter().find(|r| {
            r.pattern.is_name()
                && r.pattern.matches(Some(&name), None)
                && (port.is_some() || r.ports.is_any())
                && r.matches(Some(&name), None, port)
        }) {
            return Err(Refusal::Denied {
                rule: rule.to_string(),
            });
        }
        // Only a name rule lets a name through: an IP or CIDR rule allows addresses
        // given as addresses. Otherwise any name would be looked up to see where it
        // points, and a lookup of a made-up name carries data out to whoever
        // serves that domain, whatever the allow list says.
        if self.mode == EgressMode::Allow
            && !self
                .allow
                .iter()
                .any(|r| r.pattern.is_name() && r.matches(Some(&name), None, port))
        {
            return Err(self.not_allowed());
        }
        Ok(name)
    }

    /// Whether a connection to `addr:port`, reached by `name` (None for an IP
    /// literal), may be made. This is the decision: [`EgressPolicy::check_name`]
    /// only screens early.
    pub fn check(&self, name: Option<&str>, addr: IpAddr, port: u16) -> Result<(), Refusal> {
        let addr = canonical(addr);
        if self.mode == EgressMode::None {
            return Err(Refusal::Offline);
        }
        let name = match name {
            Some(n) => Some(normalize_name(n).map_err(|_| Refusal::BadName)?),
            None => None,
        };
        let name = name.as_deref();
        if let Some(range) = forbidden_range(addr) {
            if !self.allow_private.iter().any(|c| c.contains(addr)) {
                return Err(Refusal::Forbidden { range });
            }
        }
        if let Some(rule) = self
            .deny
            .iter()
            .find(|r| r.matches(name, Some(addr), Some(port)))
        {
            return Err(Refusal::Denied {
                rule: rule.to_string(),
            });
        }
        match self.mode {
            EgressMode::Open => Ok(()),
            _ if self
                .allow
                .iter()
                .any(|r| r.matches(name, Some(addr), Some(port))) =>
            {
                Ok(())
            }
            _ => Err(self.not_allowed()),
        }
    }

    fn not_allowed(&self) -> Refusal {
        Refusal::NotAllowed {
            allowed: self.allow.iter().map(|r| r.to_string()).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(text: &str) -> HostRule {
        text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    fn policy(mode: EgressMode, allow: &[&str], deny: &[&str]) -> EgressPolicy {
        EgressPolicy {
            mode,
            allow: allow.iter().map(|r| rule(r)).collect(),
            deny: deny.iter().map(|r| rule(r)).collect(),
            allow_private: Vec::new(),
        }
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    const PUBLIC: &str = "93.184.216.34";

    #[test]
    fn modes_parse_and_anything_else_is_refused_by_name() {
        assert_eq!("none".parse::<EgressMode>(), Ok(EgressMode::None));
        assert_eq!("allow".parse::<EgressMode>(), Ok(EgressMode::Allow));
        assert_eq!("open".parse::<EgressMode>(), Ok(EgressMode::Open));
        let err = "host".parse::<EgressMode>().unwrap_err();
        assert!(err.to_string().contains("'host'"), "{err}");
    }

    #[test]
    fn patterns_parse_into_names_subdomains_and_ranges() {
        assert_eq!(
            rule("example.com").pattern,
            HostPattern::Name("example.com".into())
        );
        assert_eq!(
            rule("*.example.com").pattern,
            HostPattern::Subdomains("example.com".into())
        );
        assert_eq!(
            rule("10.1.2.3").pattern,
            HostPattern::Range("10.1.2.3/32".parse().unwrap())
        );
        assert_eq!(
            rule("10.1.0.0/16:443").pattern,
            HostPattern::Range("10.1.0.0/16".parse().unwrap())
        );
        assert_eq!(
            rule("::1").pattern,
            HostPattern::Range("::1/128".parse().unwrap())
        );
        assert_eq!(rule("[fd00::/8]:80").ports, PortSet(vec![(80, 80)]));
        assert_eq!(rule("[::1]").ports, PortSet::any());
    }

    #[test]
    fn ports_are_single_lists_and_ranges() {
        assert_eq!(rule("a.com:443").ports, PortSet(vec![(443, 443)]));
        assert_eq!(
            rule("a.com:80,443").ports,
            PortSet(vec![(80, 80), (443, 443)])
        );
        assert_eq!(rule("a.com:8000-9000").ports, PortSet(vec![(8000, 9000)]));
        let ports = rule("a.com:80,8000-9000").ports;
        assert!(ports.contains(80) && ports.contains(8500) && !ports.contains(443));
        assert!(PortSet::any().contains(1) && PortSet::any().contains(65535));
    }

    #[test]
    fn bad_patterns_are_refused_with_one_line_naming_them() {
        for bad in [
            "",
            ":443",
            "a.com:",
            "a.com:0",
            "a.com:65536",
            "a.com:9000-8000",
            "a.com:80,,443",
            "a.com:http",
            "a.com:-1",
            "*",
            "*.",
            "**.a.com",
            "a.*.com",
            "a..com",
            ".a.com",
            "-a.com",
            "a b.com",
            "a.com/x",
            "10.0.0.0/33",
            "10.0.0.0/",
            "10.0.0.256",
            "1.2.3",
            "[::1",
            "[::1]443",
            "::1/129",
            "bücher.de",
            "例え.jp",
            "a.com\n",
        ] {
            let err = bad.parse::<HostRule>().expect_err(bad);
            let text = err.to_string();
            assert!(!text.contains('\n') || bad.contains('\n'), "{text}");
            assert!(text.contains(&format!("'{bad}'")), "{bad}: {text}");
        }
    }

    #[test]
    fn names_are_normalised_for_case_and_the_trailing_dot() {
        assert_eq!(
            rule("Example.COM.").pattern,
            HostPattern::Name("example.com".into())
        );
        let p = policy(EgressMode::Allow, &["example.com"], &[]);
        assert!(p.check(Some("EXAMPLE.com."), ip(PUBLIC), 443).is_ok());
        assert_eq!(
            p.check_name("eXample.Com.", Some(80)),
            Ok("example.com".into())
        );
    }

    #[test]
    fn non_ascii_names_are_refused_not_guessed() {
        let p = policy(EgressMode::Open, &[], &[]);
        assert_eq!(p.check_name("bücher.de", None), Err(Refusal::BadName));
        assert_eq!(
            p.check(Some("exаmple.com"), ip(PUBLIC), 443),
            Err(Refusal::BadName),
            "a Cyrillic 'а' is not an 'a'"
        );
        // The xn-- form is a name like any other.
        assert!(p.check_name("xn--bcher-kva.de", None).is_ok());
    }

    #[test]
    fn a_wildcard_matches_subdomains_but_not_the_apex() {
        let p = policy(EgressMode::Allow, &["*.example.com"], &[]);
        assert!(p.check(Some("a.example.com"), ip(PUBLIC), 443).is_ok());
        assert!(p.check(Some("a.b.example.com"), ip(PUBLIC), 443).is_ok());
        assert!(p.check(Some("example.com"), ip(PUBLIC), 443).is_err());
        assert!(p.check(Some("badexample.com"), ip(PUBLIC), 443).is_err());
        assert!(p
            .check(Some("example.com.evil.net"), ip(PUBLIC), 443)
            .is_err());
        let both = policy(EgressMode::Allow, &["*.example.com", "example.com"], &[]);
        assert!(both.check(Some("example.com"), ip(PUBLIC), 443).is_ok());
    }

    #[test]
    fn an_exact_name_does_not_match_its_subdomains() {
        let p = policy(EgressMode::Allow, &["example.com"], &[]);
        assert!(p.check(Some("www.example.com"), ip(PUBLIC), 443).is_err());
    }

    #[test]
    fn ports_limit_a_rule() {
        let p = policy(EgressMode::Allow, &["example.com:443"], &[]);
        assert!(p.check(Some("example.com"), ip(PUBLIC), 443).is_ok());
        assert!(matches!(
            p.check(Some("example.com"), ip(PUBLIC), 22),
            Err(Refusal::NotAllowed { .. })
        ));
        assert!(p.check_name("example.com", Some(22)).is_err());
        assert!(p.check_name("example.com", None).is_ok(), "DNS has no port");
    }

    #[test]
    fn deny_wins_over_allow() {
        let p = policy(
            EgressMode::Allow,
            &["*.example.com"],
            &["secret.example.com"],
        );
        assert!(p.check(Some("www.example.com"), ip(PUBLIC), 443).is_ok());
        assert!(matches!(
            p.check(Some("secret.example.com"), ip(PUBLIC), 443),
            Err(Refusal::Denied { .. })
        ));
        assert!(p.check_name("secret.example.com", None).is_err());
        let open = policy(EgressMode::Open, &[], &["93.184.0.0/16"]);
        assert!(matches!(
            open.check(Some("example.com"), ip(PUBLIC), 443),
            Err(Refusal::Denied { .. })
        ));
        assert!(open.check(Some("example.com"), ip("8.8.8.8"), 443).is_ok());
    }

    #[test]
    fn a_deny_rule_with_ports_denies_only_those_ports() {
        let p = policy(EgressMode::Open, &[], &["example.com:22"]);
        assert!(p.check(Some("example.com"), ip(PUBLIC), 22).is_err());
        assert!(p.check(Some("example.com"), ip(PUBLIC), 443).is_ok());
        assert!(p.check_name("example.com", None).is_ok());
    }

    #[test]
    fn ip_and_cidr_rules_allow_addresses_and_never_let_a_name_be_looked_up() {
        let p = policy(EgressMode::Allow, &["93.184.0.0/16:443"], &[]);
        assert!(p.check(None, ip(PUBLIC), 443).is_ok());
        assert!(p.check(None, ip(PUBLIC), 80).is_err());
        assert!(p.check(None, ip("8.8.8.8"), 443).is_err());
        // A lookup of a made-up name would carry data out by itself.
        assert!(matches!(
            p.check_name("anything.net", Some(443)),
            Err(Refusal::NotAllowed { .. })
        ));
        assert!(matches!(
            p.check_name("anything.net", None),
            Err(Refusal::NotAllowed { .. })
        ));
    }

    #[test]
    fn forbidden_ranges_are_refused_in_every_mode() {
        for addr in [
            "127.0.0.1",
            "127.5.6.7",
            "10.0.0.1",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.255",
            "0.0.0.0",
            "224.0.0.1",
            "239.255.255.250",
            "255.255.255.255",
            "198.18.0.1",
            "::",
            "::1",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::ffff:10.0.0.1",
            "::127.0.0.1",
            "64:ff9b::a00:1",
            "2002:a00:1::",
        ] {
            for mode in [EgressMode::Open, EgressMode::Allow] {
                let p = policy(mode, &[], &[]);
                let mut p = p;
                if mode == EgressMode::Allow {
                    p.allow.push(rule("0.0.0.0/0"));
                    p.allow.push(rule("::/0"));
                }
                assert!(
                    matches!(p.check(None, ip(addr), 80), Err(Refusal::Forbidden { .. })),
                    "{addr} in {mode}"
                );
                assert!(
                    matches!(
                        p.check(Some("innocent.example"), ip(addr), 80),
                        Err(Refusal::Forbidden { .. })
                    ),
                    "a name resolving to {addr} in {mode}"
                );
            }
        }
        assert_eq!(
            forbidden_range(ip("169.254.169.254")),
            Some("link-local and cloud metadata (169.254.0.0/16)")
        );
    }

    #[test]
    fn public_addresses_are_not_forbidden() {
        for addr in [
            "1.1.1.1",
            "8.8.8.8",
            PUBLIC,
            "100.63.255.255",
            "100.128.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
        ] {
            assert_eq!(forbidden_range(ip(addr)), None, "{addr}");
        }
    }

    #[test]
    fn an_opted_in_range_opens_only_itself() {
        let mut p = policy(EgressMode::Open, &[], &[]);
        p.allow_private.push("127.0.0.0/8".parse().unwrap());
        assert!(p.check(Some("local.test"), ip("127.0.0.1"), 80).is_ok());
        assert!(p.check(None, ip("::ffff:127.0.0.1"), 80).is_ok());
        assert!(p.check(None, ip("10.0.0.1"), 80).is_err());
        assert!(p.check(None, ip("169.254.169.254"), 80).is_err());
        assert!(p.check(None, ip("::1"), 80).is_err());
        // It opens the range, not the allow list.
        let mut allow = policy(EgressMode::Allow, &["good.test"], &[]);
        allow.allow_private.push("127.0.0.0/8".parse().unwrap());
        assert!(allow.check(Some("good.test"), ip("127.0.0.1"), 80).is_ok());
        assert!(allow.check(Some("bad.test"), ip("127.0.0.1"), 80).is_err());
        assert!(allow.check(None, ip("127.0.0.1"), 80).is_err());
    }

    #[test]
    fn mode_none_refuses_everything() {
        let p = EgressPolicy::default();
        assert_eq!(p.check(None, ip(PUBLIC), 443), Err(Refusal::Offline));
        assert_eq!(p.check_name("example.com", None), Err(Refusal::Offline));
    }

    #[test]
    fn allow_rules_outside_allow_mode_are_refused() {
        let p = policy(EgressMode::Open, &["a.com"], &[]);
        assert!(p.validate().is_err());
        assert!(policy(EgressMode::Open, &[], &["a.com"]).validate().is_ok());
        assert!(policy(EgressMode::Allow, &["a.com"], &[])
            .validate()
            .is_ok());
    }

    #[test]
    fn a_refusal_says_which_host_why_and_what_is_allowed() {
        let p = policy(EgressMode::Allow, &["pypi.org:443", "*.github.com"], &[]);
        let refusal = p.check(Some("evil.net"), ip(PUBLIC), 443).unwrap_err();
        let message = refusal.message("evil.net", 443);
        assert!(message.contains("evil.net:443"), "{message}");
        assert!(message.contains("pypi.org:443, *.github.com"), "{message}");
        assert!(!message.contains('\n'));
        let forbidden = p.check(None, ip("169.254.169.254"), 80).unwrap_err();
        assert!(forbidden
            .message("169.254.169.254", 80)
            .contains("cloud metadata"));
    }

    #[test]
    fn rules_and_cidrs_round_trip_through_text_and_serde() {
        for text in [
            "example.com",
            "*.example.com:443",
            "10.0.0.0/8:80,443",
            "1.2.3.4:8000-9000",
            "[fd00::/8]:53",
            "::1",
        ] {
            let r = rule(text);
            assert_eq!(r.to_string().parse::<HostRule>().unwrap(), r, "{text}");
        }
        let p = policy(EgressMode::Allow, &["a.com:443"], &["b.a.com"]);
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(serde_json::from_str::<EgressPolicy>(&json).unwrap(), p);
        assert!(serde_json::from_str::<EgressPolicy>(r#"{"allow":["a..com"]}"#).is_err());
        assert_eq!(
            "10.1.2.3/8".parse::<Cidr>().unwrap().to_string(),
            "10.0.0.0/8"
        );
    }
}
