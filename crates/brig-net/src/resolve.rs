//! The proxy's own resolver: the system's (getaddrinfo, on a blocking thread), or a
//! hosts file for air-gapped installs and tests (`--egress-hosts`), which then is
//! the only source of names. The file is read again when it changes, as a DNS zone
//! would be: an operator edits it without a restart, and every connection is
//! checked against what the name resolves to at that moment (rebinding a name to a
//! forbidden address gains nothing).

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use brig_policy::net::normalize_name;

use crate::NetError;

#[derive(Debug, Clone)]
pub enum Resolver {
    /// The host's resolver.
    System,
    /// Only these names, each to these addresses.
    Hosts(HashMap<String, Vec<IpAddr>>),
    /// Only the names of a hosts file, as it reads now.
    HostsFile(Arc<HostsFile>),
}

/// A hosts file and the names it held when last read.
#[derive(Debug)]
pub struct HostsFile {
    path: PathBuf,
    read: Mutex<(Version, Arc<Names>)>,
}

/// Each name and its addresses.
type Names = HashMap<String, Vec<IpAddr>>;

/// What tells one content of the file from the next without reading it.
type Version = Option<(SystemTime, u64, u64)>;

fn version(path: &Path) -> Version {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len(), meta.ino()))
}

impl HostsFile {
    /// The names as the file holds them now. A file that became unreadable or
    /// invalid leaves the last good names in force (and says so in the log).
    fn names(&self) -> Arc<HashMap<String, Vec<IpAddr>>> {
        let now = version(&self.path);
        let mut read = self.read.lock().unwrap_or_else(|p| p.into_inner());
        if now != read.0 {
            read.0 = now;
            match read_hosts(&self.path) {
                Ok(names) => read.1 = Arc::new(names),
                Err(e) => tracing::warn!("egress: {e}; the names read before stay in force"),
            }
        }
        read.1.clone()
    }
}

fn read_hosts(path: &Path) -> Result<HashMap<String, Vec<IpAddr>>, NetError> {
    let text = std::fs::read_to_string(path).map_err(|source| NetError::HostsFile {
        path: path.display().to_string(),
        source,
    })?;
    parse_hosts(&text).map_err(|(line, reason)| NetError::HostsLine {
        path: path.display().to_string(),
        line,
        reason,
    })
}

impl Resolver {
    /// A hosts file: `ADDRESS NAME [NAME...]` per line, `#` comments. Refused if it
    /// cannot be read or has a bad line now; later changes are read as they come.
    pub fn from_hosts_file(path: &Path) -> Result<Resolver, NetError> {
        let before = version(path);
        let names = read_hosts(path)?;
        Ok(Resolver::HostsFile(Arc::new(HostsFile {
            path: path.to_path_buf(),
            read: Mutex::new((before, Arc::new(names))),
        })))
    }

    #[cfg(test)]
    fn parse_hosts(text: &str) -> Result<Resolver, (usize, String)> {
        parse_hosts(text).map(Resolver::Hosts)
    }
}

fn parse_hosts(text: &str) -> Result<HashMap<String, Vec<IpAddr>>, (usize, String)> {
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
    Ok(names)
}

impl Resolver {
    /// Every address of `name` (normalised), or why there is none.
    pub async fn lookup(&self, name: &str) -> Result<Vec<IpAddr>, String> {
        let missing = || format!("{name} is not in the egress hosts file");
        match self {
            Resolver::Hosts(names) => names.get(name).cloned().ok_or_else(missing),
            Resolver::HostsFile(file) => file.names().get(name).cloned().ok_or_else(missing),
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

    #[tokio::test]
    async fn a_changed_hosts_file_is_read_again_and_a_broken_one_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hosts");
        std::fs::write(&path, "127.0.0.1 a.test\n").unwrap();
        let r = Resolver::from_hosts_file(&path).unwrap();
        let one: IpAddr = "127.0.0.1".parse().unwrap();
        let two: IpAddr = "127.0.0.2".parse().unwrap();
        assert_eq!(r.lookup("a.test").await.unwrap(), [one]);
        // A longer file: its size tells it apart even within the mtime's granularity.
        std::fs::write(&path, "127.0.0.2 a.test b.test\n").unwrap();
        assert_eq!(r.lookup("a.test").await.unwrap(), [two]);
        assert_eq!(r.lookup("b.test").await.unwrap(), [two]);
        std::fs::write(&path, "not-an-address a.test\n").unwrap();
        assert_eq!(r.lookup("a.test").await.unwrap(), [two]);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(r.lookup("b.test").await.unwrap(), [two]);
    }

    #[test]
    fn a_bad_hosts_line_is_named() {
        assert_eq!(Resolver::parse_hosts("x a.test").unwrap_err().0, 1);
        assert_eq!(Resolver::parse_hosts("\n1.2.3.4").unwrap_err().0, 2);
        assert!(Resolver::parse_hosts("1.2.3.4 bücher.de").is_err());
    }
}
