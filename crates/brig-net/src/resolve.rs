//! The proxy's own resolver: the system's (the host's resolv.conf and hosts file,
//! read by hickory: asynchronous, so a sandbox that floods its resolver with names
//! costs sockets and memory, never the runtime's blocking threads, which the daemon
//! needs for its own work), or a hosts file for air-gapped installs and tests (`--egress-hosts`), which then is
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
    /// The host's resolver (see [`Resolver::system`]).
    System(Arc<hickory_resolver::TokioResolver>),
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
    /// The host's: the name servers of its /etc/resolv.conf, then its /etc/hosts,
    /// each question tried twice with a 5 s timeout.
    pub fn system() -> Result<Resolver, NetError> {
        let mut builder = hickory_resolver::Resolver::builder_tokio()
            .map_err(|e| NetError::Resolver(e.to_string()))?;
        let options = builder.options_mut();
        options.timeout = std::time::Duration::from_secs(5);
        options.attempts = 2;
        options.ip_strategy = hickory_resolver::config::LookupIpStrategy::Ipv4AndIpv6;
        Ok(Resolver::System(Arc::new(builder.build())))
    }

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
            Resolver::System(resolver) => {
                // As a fully qualified name: the host's search domains are the
                // host's, not the sandbox's.
                let found = resolver.lookup_ip(format!("{name}.")).await.map_err(|e| {
                    if e.is_no_records_found() {
                        format!("{name} has no address")
                    } else {
                        format!("cannot resolve {name}: {e}")
                    }
                })?;
                let mut addrs: Vec<IpAddr> = Vec::new();
                for addr in found.iter() {
                    if !addrs.contains(&addr) {
                        addrs.push(addr);
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

#[cfg(test)]
mod system_tests {
    use std::net::{Ipv4Addr, SocketAddr};
    use std::time::{Duration, Instant};

    use hickory_resolver::config::{NameServerConfigGroup, ResolverConfig};
    use hickory_resolver::name_server::TokioConnectionProvider;

    use super::*;

    /// A name server on loopback that answers every A question with 10.9.8.7, and
    /// every other with no answer, each after `delay`.
    async fn slow_name_server(delay: Duration) -> SocketAddr {
        let socket = Arc::new(tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap());
        let addr = socket.local_addr().unwrap();
        tokio::spawn(async move {
            let mut buf = [0u8; 512];
            while let Ok((n, from)) = socket.recv_from(&mut buf).await {
                let query = buf[..n].to_vec();
                let socket = socket.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let question_end = 12 + query[12..].iter().position(|&b| b == 0).unwrap() + 5;
                    let qtype =
                        u16::from_be_bytes([query[question_end - 4], query[question_end - 3]]);
                    let answers = u16::from(qtype == 1);
                    let mut reply = query[..2].to_vec();
                    reply.extend([0x81, 0x80, 0, 1]);
                    reply.extend(answers.to_be_bytes());
                    reply.extend([0, 0, 0, 0]);
                    reply.extend(&query[12..question_end]);
                    if answers == 1 {
                        reply.extend([0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 10, 9, 8, 7]);
                    }
                    let _ = socket.send_to(&reply, from).await;
                });
            }
        });
        addr
    }

    /// Lookups are asynchronous: 200 at once against a name server that takes 200 ms
    /// each finish together, on a runtime with a single blocking thread.
    #[test]
    fn a_flood_of_lookups_needs_no_blocking_threads() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .max_blocking_threads(1)
            .build()
            .unwrap();
        runtime.block_on(async {
            let server = slow_name_server(Duration::from_millis(200)).await;
            let servers =
                NameServerConfigGroup::from_ips_clear(&[server.ip()], server.port(), true);
            let config = ResolverConfig::from_parts(None, vec![], servers);
            let mut builder = hickory_resolver::Resolver::builder_with_config(
                config,
                TokioConnectionProvider::default(),
            );
            builder.options_mut().cache_size = 0;
            let resolver = Resolver::System(Arc::new(builder.build()));
            let started = Instant::now();
            let mut lookups = tokio::task::JoinSet::new();
            for i in 0..200 {
                let resolver = resolver.clone();
                lookups.spawn(async move { resolver.lookup(&format!("n{i}.flood.test")).await });
            }
            let ten_nine = [IpAddr::V4(Ipv4Addr::new(10, 9, 8, 7))];
            while let Some(result) = lookups.join_next().await {
                assert_eq!(result.unwrap().as_deref(), Ok(&ten_nine[..]));
            }
            // One at a time they would take 40 s.
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{:?}",
                started.elapsed()
            );
        });
    }
}
