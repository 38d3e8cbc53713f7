//! Host ids for sandboxes.
//!
//! When brig runs as root, every concurrent sandbox gets its own host uid and gid
//! from a configurable range, so that no two sandboxes (and nothing on the host)
//! share an identity. A lease is an abstract unix socket named after the id: binding
//! it is atomic, and the kernel releases it when the last holder exits, even on
//! SIGKILL, so a crashed brig never leaks an id and there is no lock file to clean.

use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::str::FromStr;

use serde::Serialize;

use crate::JailError;

/// An inclusive range of host ids, `START-END`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct IdRange {
    pub start: u32,
    pub end: u32,
}

impl IdRange {
    /// Far above the ranges distributions hand out for users (1000+) and /etc/subuid
    /// (100000 + 65536*k for the first few thousand users).
    pub const DEFAULT: IdRange = IdRange {
        start: 2_000_000_000,
        end: 2_000_065_535,
    };

    pub fn len(&self) -> u64 {
        u64::from(self.end - self.start) + 1
    }

    pub fn is_empty(&self) -> bool {
        false
    }
}

impl Default for IdRange {
    fn default() -> Self {
        IdRange::DEFAULT
    }
}

impl FromStr for IdRange {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        let bad =
            || format!("invalid id range '{text}': use START-END, e.g. 2000000000-2000065535");
        let (start, end) = text.split_once('-').ok_or_else(bad)?;
        let start: u32 = start.trim().parse().map_err(|_| bad())?;
        let end: u32 = end.trim().parse().map_err(|_| bad())?;
        // 0 is root and u32::MAX is the invalid id; neither may back a sandbox.
        if start == 0 || end == u32::MAX || start > end {
            return Err(bad());
        }
        Ok(IdRange { start, end })
    }
}

/// A host id held for the lifetime of this value (and of any process that inherited
/// the socket, such as the cleanup watchdog).
#[derive(Debug)]
pub struct IdLease {
    pub id: u32,
    _socket: UnixDatagram,
}

impl IdLease {
    pub fn as_raw_fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self._socket)
    }
}

fn lease_name(id: u32) -> String {
    format!("brig/host-id/{id}")
}

/// Leases a free id from `range`, starting at a random slot so that concurrent
/// starters rarely contend for the same one.
pub fn lease(range: IdRange) -> Result<IdLease, JailError> {
    use std::os::linux::net::SocketAddrExt;
    let len = range.len();
    let offset = random_u64() % len;
    for step in 0..len {
        let id = range.start + ((offset + step) % len) as u32;
        let addr = SocketAddr::from_abstract_name(lease_name(id).as_bytes())
            .map_err(|e| JailError::sys("host id lease", e))?;
        match UnixDatagram::bind_addr(&addr) {
            Ok(socket) => {
                return Ok(IdLease {
                    id,
                    _socket: socket,
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => continue,
            Err(e) => return Err(JailError::sys("host id lease", e)),
        }
    }
    Err(JailError::IdsExhausted {
        start: range.start,
        end: range.end,
    })
}

pub(crate) fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    // SAFETY: getrandom writes at most `bytes.len()` bytes into the buffer.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if n != bytes.len() as isize {
        // Only uniqueness across concurrent starters matters here, not secrecy.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        return now ^ u64::from(std::process::id()).rotate_left(32);
    }
    u64::from_ne_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_parsing() {
        assert_eq!(
            "10-20".parse::<IdRange>().unwrap(),
            IdRange { start: 10, end: 20 }
        );
        assert_eq!("10-10".parse::<IdRange>().unwrap().len(), 1);
        for bad in ["", "10", "20-10", "0-10", "a-b", "1-4294967295"] {
            assert!(bad.parse::<IdRange>().is_err(), "{bad}");
        }
    }

    #[test]
    fn leases_are_exclusive_and_released_on_drop() {
        // A private range (random base) so parallel test runs do not collide.
        let base = 3_000_000_000 + (random_u64() % 1_000_000) as u32 * 4;
        let range = IdRange {
            start: base,
            end: base + 1,
        };
        let a = lease(range).unwrap();
        let b = lease(range).unwrap();
        assert_ne!(a.id, b.id);
        assert!(matches!(lease(range), Err(JailError::IdsExhausted { .. })));
        let freed = a.id;
        drop(a);
        let c = lease(range).unwrap();
        assert_eq!(c.id, freed);
    }
}
