//! How E2B's terms map onto brig's: templates onto images, `allowOut`/`denyOut`
//! onto a session's network policy, list filters and pages.

use std::collections::BTreeMap;

use brig_engine::config::Config;
use brig_engine::egress::Network;
use brig_engine::fault::Error;
use brig_engine::sessions::SessionInfo;

use super::wire::{template_of, NetworkConfig, ALL_IPV4};

/// The templates every daemon serves, running its `--default-image` unless
/// `--e2b-template` names them.
const DEFAULT_TEMPLATES: &[&str] = &["base", "code-interpreter-v1"];

/// The image template `name` runs (`None`: the host's system dirs), or E2B's 404.
pub fn image_of(config: &Config, name: &str) -> Result<Option<String>, Error> {
    let image = config
        .e2b_templates
        .iter()
        .rev()
        .find(|(template, _)| template == name)
        .map(|(_, image)| image.clone())
        .or_else(|| {
            DEFAULT_TEMPLATES
                .contains(&name)
                .then(|| config.default_image.clone())
        })
        .ok_or_else(|| Error::not_found(format!("template '{name}' not found")))?;
    Ok((image != "host").then_some(image))
}

fn unsupported(field: &str) -> Error {
    Error::invalid(format!("network.{field} is not supported by brig"))
}

/// The network policy E2B's fields ask for; `None` when they ask nothing (the
/// daemon's `--session-network` applies).
///
/// E2B's sandboxes reach the internet unless told otherwise, `allowOut` wins over
/// `denyOut`, and `allow_internet_access: false` is `denyOut: [0.0.0.0/0]`. brig's
/// deny rules win over its allow rules, so an `allowOut` that punches a hole into a
/// partial `denyOut` cannot be said, and is refused rather than served differently.
pub fn network_of(
    allow_internet_access: Option<bool>,
    config: Option<&NetworkConfig>,
) -> Result<Option<Network>, Error> {
    let empty = NetworkConfig::default();
    let config = config.unwrap_or(&empty);
    if config.dns_servers.as_ref().is_some_and(|d| !d.is_empty()) {
        return Err(unsupported("dnsServers"));
    }
    if config.egress_proxy.as_ref().is_some_and(|p| !p.is_null()) {
        return Err(unsupported("egressProxy"));
    }
    if config.mask_request_host.is_some() {
        return Err(unsupported("maskRequestHost"));
    }
    if config.https_ports.as_ref().is_some_and(|p| !p.is_empty()) {
        return Err(unsupported("httpsPorts"));
    }
    if config
        .rules
        .as_ref()
        .is_some_and(|r| r.as_object().is_some_and(|o| !o.is_empty()))
    {
        return Err(unsupported("rules"));
    }
    let allow_internet_access = allow_internet_access.or(config.allow_internet_access);
    let allow = config.allow_out.clone().unwrap_or_default();
    let mut deny = config.deny_out.clone().unwrap_or_default();
    if allow_internet_access.is_none() && allow.is_empty() && deny.is_empty() {
        return Ok(None);
    }
    let everything = |rule: &String| rule == ALL_IPV4 || rule == "::/0";
    let closed = allow_internet_access == Some(false) || deny.iter().any(everything);
    let network = if closed {
        Network {
            mode: if allow.is_empty() { "none" } else { "allow" }.into(),
            allow,
            deny: Vec::new(),
        }
    } else {
        if !allow.is_empty() && !deny.is_empty() {
            return Err(Error::invalid(
                "network: allowOut exceptions to a partial denyOut are not supported by \
                 brig (its deny rules win); deny 0.0.0.0/0 and list what is allowed",
            ));
        }
        deny.retain(|rule| !everything(rule));
        Network {
            mode: "open".into(),
            allow: Vec::new(),
            deny,
        }
    };
    Ok(Some(network))
}

/// E2B's `metadata` filter, as the query parser left it: `key=value&...`, the whole
/// URL-encoded once more and each key and value once more again (the SDK quotes
/// them, then url-encodes the pairs, then its HTTP client encodes the parameter).
pub fn metadata_filter(query: Option<&str>) -> Vec<(String, String)> {
    let decode = |text: &str| {
        percent_encoding::percent_decode_str(text)
            .decode_utf8_lossy()
            .into_owned()
    };
    form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .map(|(k, v)| (decode(&k), decode(&v)))
        .collect()
}

/// The `state` filter: `running`, `paused`, comma-separated; none is both.
pub fn states(values: &[String]) -> Result<Vec<String>, Error> {
    let mut states = Vec::new();
    for state in values.iter().flat_map(|v| v.split(',')).map(str::trim) {
        match state {
            "" => {}
            "running" | "paused" => states.push(state.to_string()),
            other => {
                return Err(Error::invalid(format!(
                    "state {other:?}: use running or paused"
                )))
            }
        }
    }
    Ok(states)
}

/// What a list asks for, besides metadata.
#[derive(Debug, Default)]
pub struct ListFilter {
    pub states: Vec<String>,
    pub template: Option<String>,
    /// Unix seconds.
    pub started_after: Option<i64>,
    pub ascending: bool,
}

/// The sessions `filter` keeps, in its order (by start, then id).
pub fn filtered(mut sessions: Vec<SessionInfo>, filter: &ListFilter) -> Vec<SessionInfo> {
    sessions.retain(|s| {
        (filter.states.is_empty() || filter.states.contains(&s.state))
            && filter
                .template
                .as_ref()
                .is_none_or(|t| *t == template_of(s))
            && filter.started_after.is_none_or(|after| {
                brig_engine::sessions::parse_rfc3339(&s.created_at).is_some_and(|t| t >= after)
            })
    });
    sessions.sort_by_key(key);
    if !filter.ascending {
        sessions.reverse();
    }
    sessions
}

/// The most sandboxes a page holds, and how many when `limit` is not given.
pub const MAX_PAGE: usize = 100;

/// A sandbox's place in a list: its start (the engine's fixed-width RFC 3339, to
/// the millisecond, which sorts as text), then its id.
fn key(s: &SessionInfo) -> (String, String) {
    (s.created_at.clone(), s.session_id.clone())
}

/// One page of `sessions` (already in `filter`'s order): the page, and the token
/// of the next one if there is more. A token is the hex of the last sandbox shown
/// (its start and id): the next page starts after it, even if it has gone since.
pub fn page(
    sessions: Vec<SessionInfo>,
    filter: &ListFilter,
    limit: Option<i64>,
    next_token: Option<&str>,
) -> Result<(Vec<SessionInfo>, Option<String>), Error> {
    let limit = match limit {
        None => MAX_PAGE,
        Some(n) if (1..=MAX_PAGE as i64).contains(&n) => n as usize,
        Some(_) => {
            return Err(Error::invalid(format!(
                "limit must be between 1 and {MAX_PAGE}"
            )))
        }
    };
    let start = match next_token.filter(|t| !t.is_empty()) {
        None => 0,
        Some(token) => {
            let after = hex::decode(token)
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .and_then(|text| {
                    let (at, id) = text.split_once('|')?;
                    Some((at.to_string(), id.to_string()))
                })
                .ok_or_else(|| Error::invalid("nextToken is not one this API gave"))?;
            sessions
                .iter()
                .take_while(|s| {
                    let k = key(s);
                    if filter.ascending {
                        k <= after
                    } else {
                        k >= after
                    }
                })
                .count()
        }
    };
    let rest: Vec<SessionInfo> = sessions.into_iter().skip(start).collect();
    let more = rest.len() > limit;
    let page: Vec<SessionInfo> = rest.into_iter().take(limit).collect();
    let token = more
        .then(|| {
            page.last().map(|s| {
                let (at, id) = key(s);
                hex::encode(format!("{at}|{id}"))
            })
        })
        .flatten();
    Ok((page, token))
}

/// The caller's labels for a new sandbox: its own, and the template it asked for.
pub fn labels(
    metadata: Option<BTreeMap<String, String>>,
    template: &str,
) -> Result<BTreeMap<String, String>, Error> {
    let mut labels = metadata.unwrap_or_default();
    if labels.contains_key(super::wire::TEMPLATE_KEY) {
        return Err(Error::invalid(format!(
            "metadata key {} is brig's own",
            super::wire::TEMPLATE_KEY
        )));
    }
    labels.insert(super::wire::TEMPLATE_KEY.to_string(), template.to_string());
    Ok(labels)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(templates: &[(&str, &str)]) -> Config {
        Config {
            default_image: "python".into(),
            e2b_templates: templates
                .iter()
                .map(|(n, i)| (n.to_string(), i.to_string()))
                .collect(),
            ..Config::default()
        }
    }

    #[test]
    fn templates_map_to_images_and_unknown_ones_are_404() {
        let c = config(&[("base", "host"), ("data", "sci")]);
        assert_eq!(image_of(&c, "base").unwrap(), None);
        assert_eq!(image_of(&c, "data").unwrap(), Some("sci".into()));
        assert_eq!(
            image_of(&c, "code-interpreter-v1").unwrap(),
            Some("python".into())
        );
        let e = image_of(&c, "nodejs").unwrap_err();
        assert_eq!(e.code.as_str(), "not_found");
        assert_eq!(e.message, "template 'nodejs' not found");
    }

    fn net(allow: &[&str], deny: &[&str]) -> NetworkConfig {
        NetworkConfig {
            allow_out: Some(allow.iter().map(|s| s.to_string()).collect()),
            deny_out: Some(deny.iter().map(|s| s.to_string()).collect()),
            ..NetworkConfig::default()
        }
    }

    #[test]
    fn e2b_network_fields_become_brig_policies() {
        assert_eq!(network_of(None, None).unwrap(), None);
        let mode = |n: Option<Network>| n.map(|n| (n.mode, n.allow, n.deny));
        assert_eq!(
            mode(network_of(Some(false), None).unwrap()),
            Some(("none".into(), vec![], vec![]))
        );
        assert_eq!(
            mode(network_of(Some(true), None).unwrap()),
            Some(("open".into(), vec![], vec![]))
        );
        assert_eq!(
            mode(network_of(None, Some(&net(&["pypi.org"], &["0.0.0.0/0"]))).unwrap()),
            Some(("allow".into(), vec!["pypi.org".into()], vec![]))
        );
        assert_eq!(
            mode(network_of(None, Some(&net(&[], &["8.8.8.8"]))).unwrap()),
            Some(("open".into(), vec![], vec!["8.8.8.8".into()]))
        );
        let e = network_of(None, Some(&net(&["1.1.1.1"], &["1.0.0.0/8"]))).unwrap_err();
        assert!(e.message.contains("allowOut"), "{}", e.message);
        let masked = NetworkConfig {
            mask_request_host: Some("x".into()),
            ..NetworkConfig::default()
        };
        assert!(network_of(None, Some(&masked))
            .unwrap_err()
            .message
            .contains("maskRequestHost"));
    }

    fn info(id: &str, at: i64) -> SessionInfo {
        serde_json::from_value(serde_json::json!({
            "session_id": id, "state": "running", "image": null, "snapshot": null,
            "created_at": brig_engine::sessions::rfc3339(at), "expires_at": null,
            "idle_timeout_seconds": null, "last_active_at": "", "pooled": false,
            "mounts": [], "volume": null, "metadata": {},
            "network": {"mode": "none", "allow": [], "deny": []},
            "limits": {}, "enforced": {},
        }))
        .unwrap()
    }

    #[test]
    fn pages_follow_each_other_without_gaps_or_repeats() {
        let all: Vec<SessionInfo> = (0..5).map(|i| info(&format!("s{i}"), 100 + i)).collect();
        let f = ListFilter::default();
        let sorted = filtered(all, &f);
        assert_eq!(sorted[0].session_id, "s4");
        let (first, token) = page(sorted.clone(), &f, Some(2), None).unwrap();
        assert_eq!(first.len(), 2);
        // The last one shown has gone meanwhile: the next page still starts after it.
        let without: Vec<_> = sorted
            .iter()
            .filter(|s| s.session_id != "s3")
            .cloned()
            .collect();
        let (second, token) = page(without, &f, Some(2), token.as_deref()).unwrap();
        assert_eq!(second[0].session_id, "s2");
        let (third, token) = page(sorted.clone(), &f, Some(2), token.as_deref()).unwrap();
        assert_eq!(token, None);
        let ids: Vec<_> = [first, second, third]
            .concat()
            .into_iter()
            .map(|s| s.session_id)
            .collect();
        assert_eq!(ids, ["s4", "s3", "s2", "s1", "s0"]);
        assert!(page(sorted.clone(), &f, Some(0), None).is_err());
        assert!(page(sorted, &f, None, Some("zz")).is_err());
    }

    #[test]
    fn metadata_and_state_filters_parse() {
        assert_eq!(
            metadata_filter(Some("a%2520b=c%2526d&e=f")),
            vec![("a b".into(), "c&d".into()), ("e".into(), "f".into())]
        );
        assert_eq!(
            states(&["running,paused".into()]).unwrap(),
            ["running", "paused"]
        );
        assert!(states(&["dead".into()]).is_err());
    }
}
