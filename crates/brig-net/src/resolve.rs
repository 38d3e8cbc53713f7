//! The proxy's own resolver: the system's (getaddrinfo, on a blocking thread), or a
//! hosts file for air-gapped installs and tests (`--egress-hosts`), which then is
//! the only source of names.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::Path;

use brig_policy::net::normalize_name;

use crate::NetError;

#[derive(Debug, Clone)]
pub enum Resolver {
    /// The host's resolver.
    System,
    /// Only these names, each to these addresses.
    Hosts(HashMap<String, Vec<IpAddr>>),
}

impl Resolver {
    /// A hosts file: `ADDRESS NAME [NAME...]` per line, `#` comments.
    pub fn from_hosts_file(path: &Path) -> Result<Resolver, NetError> {
        let text = std::fs::read_to_string(path).map_err(|source| NetError::HostsFile {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse_hosts(&text).map_err(|(line, reason)| NetError::HostsLine {
            path: path.display().to_string(),
            line,
            reason,
        })
    }

    fn parse_hosts(text: &str) -> Result<Resolver, (usize, String)> {
        let mut names: HashMap<String, Vec<IpAddr>> = HashMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("");
            let mut fields = line.split_whitespace();
            let Some(addr) = fields.next() else { continue };
            let addr: IpAddr = addr
                .parse()
                .map_err(|_| (n + 1, format!("'{addr}' is not an IP address")))?;
            let mut any = false;
            for name in fields {
                let name = normalize_name(name).map_err(|e| (n + 1, e.to_string()))?;
                let entry = names.entry(name).or_default();
                if !entry.contains(&addr) {
                    entry.push(addr);
                }
                any = true;
            }
            if !any {
                return Err((n + 1, "an address with no name".into()));
            }
        }
        Ok(Resolver::Hosts(names))
    }

    /// Every address of `name` (normalised), or why there is none.
    pub async fn lookup(&self, name: &str) -> Result<Vec<IpAddr>, String> {
        match self {
            Resolver::Hosts(names) => names
                .get(name)
                .cloned()
                .ok_or_else(|| format!("{name} is not in the egress hosts file")),
            Resolver::System => {
                let found = tokio::net::lookup_host((name, 0))
                    .await
                    .map_err(|e| format!("cannot resolve {name}: {e}"))?;
                let mut addrs: Vec<IpAddr> = Vec::new();
                for addr in found {
                    if !addrs.contains(&addr.ip()) {
                        addrs.push(addr.ip());
                    }
                }
                if addrs.is_empty() {
                    return Err(format!("{name} has no address"));
                }
                Ok(addrs)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hosts_file_maps_names_case_insensitively() {
        let r = Resolver::parse_hosts("# test\n127.0.0.1 Good.Test good2.test\n::1 good.test\n")
            .unwrap();
        let Resolver::Hosts(names) = r else { panic!() };
        assert_eq!(names["good.test"].len(), 2);
        assert_eq!(
            names["good2.test"],
            vec!["127.0.0.1".parse::<IpAddr>().unwrap()]
        );
    }

    #[test]
    fn a_bad_hosts_line_is_named() {
        assert_eq!(Resolver::parse_hosts("x a.test").unwrap_err().0, 1);
        assert_eq!(Resolver::parse_hosts("\n1.2.3.4").unwrap_err().0, 2);
        assert!(Resolver::parse_hosts("1.2.3.4 bücher.de").is_err());
    }
}
