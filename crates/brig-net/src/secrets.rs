//! Secrets a sandbox never sees: inside it each one is a placeholder
//! (`brig-secret-NAME-<random>`), and the proxy puts the real value into the
//! request line and headers of requests toward the secret's hosts only. A
//! placeholder seen in a request toward any other host is not substituted: the
//! request is refused and recorded as an attempted exfiltration.
//!
//! What is looked at: the request line and headers (and the user:password inside
//! `Authorization: Basic`, as git and pip send credentials), and the part of the body that
//! arrived with them (for a refusal only: bodies are never rewritten), of plain
//! HTTP through the proxy and of TLS the proxy intercepts (secret hosts on 443).
//! A tunnel that is not intercepted is opaque: a placeholder inside it cannot be
//! seen, which is harmless (a placeholder is worthless without the proxy).

use brig_policy::net::{normalize_name, HostPattern, HostRule};

/// One secret: its name (the sandbox's variable), value and the hosts it may reach.
/// `Debug` never shows the value.
#[derive(Clone)]
pub struct Secret {
    name: String,
    value: String,
    hosts: Vec<HostPattern>,
    placeholder: String,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secret")
            .field("name", &self.name)
            .field("value", &"<redacted>")
            .field("hosts", &self.hosts_text())
            .finish()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("secret name {0:?}: use letters, digits and '_' (an environment variable's name), at most 64")]
    BadName(String),
    #[error("secret {0}: the value is empty or holds a line break or NUL, which cannot go into a header")]
    BadValue(String),
    #[error("secret {name}: host {host:?} is not a name or *.name (no IPs, no ports)")]
    BadHost { name: String, host: String },
    #[error("secret {0}: no hosts to send it to")]
    NoHosts(String),
    #[error("secret {0} is given twice")]
    Duplicate(String),
    #[error("secret {0}: its stored placeholder is not one brig makes")]
    BadPlaceholder(String),
    #[error("no randomness for the placeholder: {0}")]
    Random(String),
}

impl Secret {
    /// A secret with a fresh placeholder. `hosts` are `example.com` or `*.example.com`.
    pub fn new(name: &str, value: String, hosts: &[String]) -> Result<Secret, SecretError> {
        let mut random = [0u8; 16];
        getrandom::fill(&mut random).map_err(|e| SecretError::Random(e.to_string()))?;
        let hex: String = random.iter().map(|b| format!("{b:02x}")).collect();
        Secret::with_placeholder(name, value, hosts, format!("brig-secret-{name}-{hex}"))
    }

    /// A secret whose placeholder was made before (by [`Secret::new`]): a restarted
    /// daemon serves a sandbox that holds it already. The placeholder must have
    /// the shape `new` gives it.
    pub fn with_placeholder(
        name: &str,
        value: String,
        hosts: &[String],
        placeholder: String,
    ) -> Result<Secret, SecretError> {
        let name_ok = !name.is_empty()
            && name.len() <= 64
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !name_ok {
            return Err(SecretError::BadName(name.to_string()));
        }
        if value.is_empty() || value.bytes().any(|b| matches!(b, b'\r' | b'\n' | 0)) {
            return Err(SecretError::BadValue(name.to_string()));
        }
        if hosts.is_empty() {
            return Err(SecretError::NoHosts(name.to_string()));
        }
        let hosts = hosts
            .iter()
            .map(|host| {
                let bad = || SecretError::BadHost {
                    name: name.to_string(),
                    host: host.clone(),
                };
                match host.parse::<HostRule>() {
                    Ok(rule)
                        if rule.ports.is_any()
                            && !matches!(rule.pattern, HostPattern::Range(_)) =>
                    {
                        Ok(rule.pattern)
                    }
                    _ => Err(bad()),
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        let random = placeholder.strip_prefix(&format!("brig-secret-{name}-"));
        if !random.is_some_and(|r| r.len() == 32 && r.bytes().all(|b| b.is_ascii_hexdigit())) {
            return Err(SecretError::BadPlaceholder(name.to_string()));
        }
        Ok(Secret {
            placeholder,
            name: name.to_string(),
            value,
            hosts,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// What the sandbox gets instead of the value.
    pub fn placeholder(&self) -> &str {
        &self.placeholder
    }

    /// The hosts, each in its canonical form.
    pub fn hosts(&self) -> Vec<String> {
        self.hosts.iter().map(|h| h.to_string()).collect()
    }

    /// The hosts as given, for messages.
    pub fn hosts_text(&self) -> String {
        let hosts: Vec<String> = self.hosts.iter().map(|h| h.to_string()).collect();
        hosts.join(", ")
    }

    /// Whether the value may go to `host` (a name as the client wrote it).
    pub fn covers(&self, host: &str) -> bool {
        let Ok(host) = normalize_name(host) else {
            return false;
        };
        self.hosts.iter().any(|pattern| match pattern {
            HostPattern::Name(n) => *n == host,
            HostPattern::Subdomains(suffix) => host
                .strip_suffix(suffix.as_str())
                .and_then(|head| head.strip_suffix('.'))
                .is_some_and(|head| !head.is_empty()),
            HostPattern::Range(_) => false,
        })
    }
}

/// Checks a list: no name twice.
pub fn check_unique(secrets: &[Secret]) -> Result<(), SecretError> {
    let mut names: Vec<&str> = secrets.iter().map(|s| s.name()).collect();
    names.sort_unstable();
    match names.windows(2).find(|w| w[0] == w[1]) {
        Some(w) => Err(SecretError::Duplicate(w[0].to_string())),
        None => Ok(()),
    }
}

/// A placeholder in a request toward a host its secret may not reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leak {
    pub secret: String,
    pub host: String,
    pub allowed: String,
}

impl Leak {
    /// One line for the model reading the refusal.
    pub fn message(&self) -> String {
        format!(
            "brig egress refused this request: it carries the placeholder of secret {} toward {}, \
             but that secret may only be sent to {} (brig puts the real value in there, and nowhere else)",
            self.secret, self.host, self.allowed
        )
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The request head toward `host` with every placeholder of a secret that covers
/// `host` replaced by its value. `body` is what arrived after the head: only
/// looked at. Any placeholder of a secret that does not cover `host`, in either,
/// is a [`Leak`] (the first such secret).
pub(crate) fn rewrite_head(
    secrets: &[Secret],
    host: &str,
    head: &[u8],
    body: &[u8],
) -> Result<Option<Vec<u8>>, Leak> {
    let mut out: Option<Vec<u8>> = None;
    for secret in secrets {
        let needle = secret.placeholder.as_bytes();
        let current = out.as_deref().unwrap_or(head);
        let in_head = find(current, needle).is_some();
        if !in_head && find(body, needle).is_none() {
            continue;
        }
        if !secret.covers(host) {
            return Err(Leak {
                secret: secret.name.clone(),
                host: host.to_string(),
                allowed: secret.hosts_text(),
            });
        }
        if in_head {
            out = Some(replace_all(current, needle, secret.value.as_bytes()));
        }
    }
    match rewrite_basic(secrets, host, out.as_deref().unwrap_or(head))? {
        Some(rewritten) => Ok(Some(rewritten)),
        None => Ok(out),
    }
}

/// `Authorization: Basic base64(user:password)` with a placeholder inside: the
/// same rules, applied to the decoded credentials.
fn rewrite_basic(secrets: &[Secret], host: &str, head: &[u8]) -> Result<Option<Vec<u8>>, Leak> {
    use base64::Engine;
    const PREFIX: &[u8] = b"authorization:";
    let engine = base64::engine::general_purpose::STANDARD;
    let mut out = Vec::with_capacity(head.len());
    let mut changed = false;
    for line in head.split_inclusive(|&b| b == b'\n') {
        let rewritten = (|| {
            let name = line.get(..PREFIX.len())?;
            if !name.eq_ignore_ascii_case(PREFIX) {
                return None;
            }
            let value = line[PREFIX.len()..].trim_ascii();
            let scheme = value.get(..6)?;
            if !scheme.eq_ignore_ascii_case(b"basic ") {
                return None;
            }
            let decoded = engine.decode(value[6..].trim_ascii()).ok()?;
            Some(rewrite_head(secrets, host, &decoded, b"").map(|new| {
                new.map(|new| {
                    let mut line = line[..PREFIX.len()].to_vec();
                    line.extend_from_slice(b" Basic ");
                    line.extend_from_slice(engine.encode(new).as_bytes());
                    line.extend_from_slice(b"\r\n");
                    line
                })
            }))
        })();
        match rewritten {
            Some(Err(leak)) => return Err(leak),
            Some(Ok(Some(new))) => {
                out.extend_from_slice(&new);
                changed = true;
            }
            _ => out.extend_from_slice(line),
        }
    }
    Ok(changed.then_some(out))
}

fn replace_all(haystack: &[u8], needle: &[u8], with: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(haystack.len() + with.len());
    let mut rest = haystack;
    while let Some(i) = find(rest, needle) {
        out.extend_from_slice(&rest[..i]);
        out.extend_from_slice(with);
        rest = &rest[i + needle.len()..];
    }
    out.extend_from_slice(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(name: &str, value: &str, hosts: &[&str]) -> Secret {
        let hosts: Vec<String> = hosts.iter().map(|h| h.to_string()).collect();
        Secret::new(name, value.to_string(), &hosts).unwrap()
    }

    #[test]
    fn placeholders_are_unique_and_say_nothing_of_the_value() {
        let a = secret("TOKEN", "hunter2", &["api.test"]);
        let b = secret("TOKEN", "hunter2", &["api.test"]);
        assert_ne!(a.placeholder(), b.placeholder());
        assert!(a.placeholder().starts_with("brig-secret-TOKEN-"));
        assert_eq!(a.placeholder().len(), "brig-secret-TOKEN-".len() + 32);
        assert!(!a.placeholder().contains("hunter2"));
        let shown = format!("{a:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("redacted"));
    }

    #[test]
    fn a_secret_comes_back_with_its_placeholder_and_no_other() {
        let a = secret("TOKEN", "v", &["API.test"]);
        assert_eq!(a.hosts(), vec!["api.test".to_string()]);
        let again =
            Secret::with_placeholder("TOKEN", "v".into(), &a.hosts(), a.placeholder().into())
                .unwrap();
        assert_eq!(again.placeholder(), a.placeholder());
        let hosts = a.hosts();
        for bad in [
            "brig-secret-OTHER-00000000000000000000000000000000".to_string(),
            format!("{}0", a.placeholder()),
            "x".to_string(),
        ] {
            let r = Secret::with_placeholder("TOKEN", "v".into(), &hosts, bad);
            assert!(matches!(r, Err(SecretError::BadPlaceholder(_))));
        }
    }

    #[test]
    fn bad_secrets_are_refused() {
        let v = || "v".to_string();
        let hosts = vec!["a.test".to_string()];
        assert!(matches!(
            Secret::new("A-B", v(), &hosts),
            Err(SecretError::BadName(_))
        ));
        assert!(matches!(
            Secret::new("1A", v(), &hosts),
            Err(SecretError::BadName(_))
        ));
        assert!(matches!(
            Secret::new("A", "x\r\nEvil: 1".into(), &hosts),
            Err(SecretError::BadValue(_))
        ));
        assert!(matches!(
            Secret::new("A", v(), &[]),
            Err(SecretError::NoHosts(_))
        ));
        for host in ["10.0.0.1", "a.test:443", "bad host", ""] {
            let r = Secret::new("A", v(), &[host.to_string()]);
            assert!(matches!(r, Err(SecretError::BadHost { .. })), "{host}");
        }
        let list = [secret("A", "1", &["a.test"]), secret("A", "2", &["b.test"])];
        assert_eq!(check_unique(&list), Err(SecretError::Duplicate("A".into())));
    }

    #[test]
    fn hosts_match_like_the_allowlist() {
        let s = secret("T", "v", &["api.test", "*.example.test"]);
        assert!(s.covers("api.test"));
        assert!(s.covers("API.test."));
        assert!(s.covers("x.example.test"));
        assert!(!s.covers("example.test"));
        assert!(!s.covers("api.test.evil"));
        assert!(!s.covers("evilapi.test"));
        assert!(!s.covers("127.0.0.1"));
    }

    #[test]
    fn the_value_goes_only_toward_its_hosts() {
        let s = secret("T", "s3cr3t", &["api.test"]);
        let other = secret("U", "other", &["other.test"]);
        let list = [s.clone(), other];
        let head = format!(
            "GET /x?key={p} HTTP/1.1\r\nAuthorization: Bearer {p}\r\n\r\n",
            p = s.placeholder()
        );
        let out = rewrite_head(&list, "api.test", head.as_bytes(), b"")
            .unwrap()
            .unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "GET /x?key=s3cr3t HTTP/1.1\r\nAuthorization: Bearer s3cr3t\r\n\r\n"
        );
        let leak = rewrite_head(&list, "evil.test", head.as_bytes(), b"").unwrap_err();
        assert_eq!(leak.secret, "T");
        assert_eq!(leak.allowed, "api.test");
        assert!(leak.message().contains("api.test") && !leak.message().contains("s3cr3t"));
        // In the body: never rewritten, but a leak elsewhere.
        let plain = b"POST / HTTP/1.1\r\n\r\n";
        let body = s.placeholder().as_bytes();
        assert_eq!(rewrite_head(&list, "api.test", plain, body), Ok(None));
        assert!(rewrite_head(&list, "evil.test", plain, body).is_err());
        // Nothing to do.
        assert_eq!(rewrite_head(&list, "evil.test", plain, b"x"), Ok(None));
    }

    #[test]
    fn basic_credentials_are_decoded_checked_and_reencoded() {
        use base64::Engine;
        let engine = base64::engine::general_purpose::STANDARD;
        let s = secret("T", "s3cr3t", &["git.test"]);
        let list = [s.clone()];
        let creds = engine.encode(format!("x-token:{}", s.placeholder()));
        let head = format!("GET / HTTP/1.1\r\nauthorization: Basic {creds}\r\nAccept: */*\r\n\r\n");
        let out = rewrite_head(&list, "git.test", head.as_bytes(), b"")
            .unwrap()
            .unwrap();
        let expected = engine.encode("x-token:s3cr3t");
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!("GET / HTTP/1.1\r\nauthorization: Basic {expected}\r\nAccept: */*\r\n\r\n")
        );
        let leak = rewrite_head(&list, "evil.test", head.as_bytes(), b"").unwrap_err();
        assert_eq!(leak.secret, "T");
        // Basic credentials without a placeholder, or not base64: untouched.
        let other = format!(
            "GET / HTTP/1.1\r\nAuthorization: Basic {}\r\n\r\n",
            engine.encode("a:b")
        );
        assert_eq!(
            rewrite_head(&list, "evil.test", other.as_bytes(), b""),
            Ok(None)
        );
        let junk = b"GET / HTTP/1.1\r\nAuthorization: Basic !!!\r\n\r\n";
        assert_eq!(rewrite_head(&list, "evil.test", junk, b""), Ok(None));
    }
}
