//! Sessions' secrets (`secrets` on create): each appears in the sandbox as a
//! placeholder in its variable, and the session's proxy puts the value into
//! requests toward the secret's hosts only (see `brig_net::secrets`).
//!
//! A value lives in the daemon's memory and in its session's catalog row (the
//! database in the 0700 data dir, itself 0600), which a restarted daemon serves
//! it from. It is in no log, no audit event, no API answer, and neither in the
//! stored create request nor in anything under the session's directory: the
//! sandbox's spec holds the placeholder only. Types that hold a value print it
//! as `<redacted>`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::fault::Error as ApiError;

/// A secret's value: `Debug` never shows it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SecretValue(pub String);

impl std::fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("\"<redacted>\"")
    }
}

/// A secret as a create request gives it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretRequest {
    /// The sandbox's variable holding the placeholder.
    pub name: String,
    pub value: SecretValue,
    /// `example.com` or `*.example.com`: where the value may go.
    pub hosts: Vec<String>,
}

/// A session's secret as the daemon keeps (and stores) it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionSecret {
    pub name: String,
    /// Canonical patterns.
    pub hosts: Vec<String>,
    pub placeholder: String,
    pub value: SecretValue,
}

/// What the API shows of a secret: never its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretInfo {
    pub name: String,
    pub hosts: Vec<String>,
    /// What the sandbox holds instead of the value (worthless without the proxy):
    /// for a caller that puts it in a file rather than use the variable.
    pub placeholder: String,
}

impl SessionSecret {
    pub fn info(&self) -> SecretInfo {
        SecretInfo {
            name: self.name.clone(),
            hosts: self.hosts.clone(),
            placeholder: self.placeholder.clone(),
        }
    }

    /// The proxy's form of it (the same placeholder).
    pub fn to_net(&self) -> Result<brig_net::Secret, ApiError> {
        brig_net::Secret::with_placeholder(
            &self.name,
            self.value.0.clone(),
            &self.hosts,
            self.placeholder.clone(),
        )
        .map_err(|e| ApiError::internal(format!("stored secret: {e}")))
    }
}

/// A request's secrets, checked, each with a fresh placeholder: 422 naming the
/// first bad name, value or host, a name given twice, a name the request's `env`
/// also sets, or secrets without a way out (`egress`: the session has one).
pub fn from_request(
    asked: &[SecretRequest],
    env: Option<&BTreeMap<String, String>>,
    egress: bool,
) -> Result<Vec<SessionSecret>, ApiError> {
    if asked.is_empty() {
        return Ok(Vec::new());
    }
    if !egress {
        return Err(ApiError::invalid(
            "secrets need a network mode other than \"none\": without a way out no request \
             could carry them",
        ));
    }
    let bad = |e: brig_net::SecretError| ApiError::invalid(format!("secrets: {e}"));
    let list = asked
        .iter()
        .map(|s| brig_net::Secret::new(&s.name, s.value.0.clone(), &s.hosts).map_err(bad))
        .collect::<Result<Vec<_>, _>>()?;
    brig_net::secrets::check_unique(&list).map_err(bad)?;
    if let Some(name) = list
        .iter()
        .map(brig_net::Secret::name)
        .find(|name| env.is_some_and(|env| env.contains_key(*name)))
    {
        return Err(ApiError::invalid(format!(
            "secrets: {name} is also in env; the variable holds the secret's placeholder"
        )));
    }
    Ok(list
        .iter()
        .zip(asked)
        .map(|(s, asked)| SessionSecret {
            name: s.name().to_string(),
            hosts: s.hosts(),
            placeholder: s.placeholder().to_string(),
            value: asked.value.clone(),
        })
        .collect())
}

/// Gives the sandbox of `spec` its secrets: each variable with its placeholder,
/// the variables that point TLS clients at the CA bundle, and the daemon's CA in
/// that bundle (`ca_pem`).
pub fn offer(spec: &mut brig_policy::SandboxSpec, secrets: &[SessionSecret], ca_pem: &str) {
    if secrets.is_empty() {
        return;
    }
    for secret in secrets {
        spec.env
            .insert(secret.name.clone(), secret.placeholder.clone());
    }
    for (key, value) in brig_net::ca_env() {
        spec.env.entry(key).or_insert(value);
    }
    spec.filesystem.extra_ca = Some(ca_pem.to_string());
}

/// A session's secrets as its row stores them (`None`: it has none).
pub fn stored(secrets: &[SessionSecret]) -> Result<Option<String>, ApiError> {
    if secrets.is_empty() {
        return Ok(None);
    }
    serde_json::to_string(secrets)
        .map(Some)
        .map_err(ApiError::internal)
}

/// A session's secrets from its row.
pub fn from_stored(json: Option<&str>) -> Result<Vec<SessionSecret>, String> {
    match json {
        None => Ok(Vec::new()),
        Some(json) => serde_json::from_str(json).map_err(|e| e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(name: &str, value: &str, hosts: &[&str]) -> SecretRequest {
        SecretRequest {
            name: name.into(),
            value: SecretValue(value.into()),
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
        }
    }

    #[test]
    fn values_never_print() {
        let asked = ask("TOKEN", "hunter2", &["api.test"]);
        assert!(!format!("{asked:?}").contains("hunter2"));
        let kept = from_request(&[asked], None, true).unwrap();
        assert!(!format!("{kept:?}").contains("hunter2"));
        let shown = serde_json::to_string(&kept[0].info()).unwrap();
        assert!(!shown.contains("hunter2"), "{shown}");
    }

    #[test]
    fn bad_secrets_are_refused_by_name() {
        let env = BTreeMap::from([("HOME_TOKEN".to_string(), "x".to_string())]);
        for (asked, egress, named) in [
            (vec![ask("A", "v", &["a.test"])], false, "none"),
            (
                vec![ask("A", "v", &["a.test"]), ask("A", "w", &["b.test"])],
                true,
                "A is given twice",
            ),
            (vec![ask("A", "v", &["10.0.0.0/8"])], true, "10.0.0.0/8"),
            (vec![ask("A-B", "v", &["a.test"])], true, "A-B"),
            (vec![ask("HOME_TOKEN", "v", &["a.test"])], true, "env"),
        ] {
            let err = from_request(&asked, Some(&env), egress).unwrap_err();
            assert_eq!(err.code.as_str(), "invalid_request");
            assert!(err.message.contains(named), "{named}: {}", err.message);
        }
    }

    #[test]
    fn a_stored_secret_serves_the_same_placeholder() {
        let kept = from_request(&[ask("T", "v", &["*.Api.test"])], None, true).unwrap();
        assert_eq!(kept[0].hosts, vec!["*.api.test".to_string()]);
        let back = from_stored(stored(&kept).unwrap().as_deref()).unwrap();
        assert_eq!(back, kept);
        assert_eq!(back[0].to_net().unwrap().placeholder(), kept[0].placeholder);
        assert_eq!(stored(&[]).unwrap(), None);
        let mut spec = brig_policy::SandboxSpec::new(Vec::new());
        offer(&mut spec, &kept, "PEM");
        assert_eq!(spec.env["T"], kept[0].placeholder);
        assert_eq!(spec.filesystem.extra_ca.as_deref(), Some("PEM"));
    }
}
