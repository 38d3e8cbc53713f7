//! Synthetic addresses: the sandbox's DNS resolver answers each allowed name with
//! an address of its own from a range that is never a real destination
//! (198.18.0.0/15, forbidden by policy), and the proxy maps it back to the name.
//! So a program that resolves first and connects to the address, through a proxy
//! or captured transparently, still reaches the name it asked for, and nothing
//! it does with addresses reaches anything else.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Mutex;

/// At most this many names per sandbox (a wildcard rule lets a sandbox make up
/// names: this bounds what they cost brig, about 100 bytes each).
const MAX_NAMES: u32 = 16_384;

pub struct Synthetic {
    base: u32,
    /// Addresses in the range.
    range: u64,
    /// Addresses that may be handed out (offset 0 never is).
    size: u32,
    inner: Mutex<Maps>,
}

#[derive(Default)]
struct Maps {
    by_name: HashMap<String, u32>,
    by_offset: Vec<String>,
}

impl Synthetic {
    pub fn new((net, prefix): (Ipv4Addr, u8)) -> Synthetic {
        let range = 1u64 << (32 - u32::from(prefix));
        Synthetic {
            base: u32::from(net),
            range,
            size: range.min(u64::from(MAX_NAMES) + 1) as u32,
            inner: Mutex::new(Maps::default()),
        }
    }

    /// The address of `name` (normalised), given out once; `None` when the range is spent.
    pub fn address_of(&self, name: &str) -> Option<Ipv4Addr> {
        let mut maps = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&offset) = maps.by_name.get(name) {
            return Some(Ipv4Addr::from(self.base + offset));
        }
        // Offset 0 is the network's own address: never handed out.
        let offset = maps.by_offset.len() as u32 + 1;
        if offset >= self.size {
            return None;
        }
        maps.by_offset.push(name.to_string());
        maps.by_name.insert(name.to_string(), offset);
        Some(Ipv4Addr::from(self.base + offset))
    }

    /// Whether `addr` is in the synthetic range at all.
    pub fn covers(&self, addr: IpAddr) -> bool {
        match brig_policy::net::canonical(addr) {
            IpAddr::V4(v4) => {
                let a = u32::from(v4);
                a >= self.base && u64::from(a - self.base) < self.range
            }
            IpAddr::V6(_) => false,
        }
    }

    /// The name `addr` was given to, if it was.
    pub fn name_of(&self, addr: IpAddr) -> Option<String> {
        let IpAddr::V4(v4) = brig_policy::net::canonical(addr) else {
            return None;
        };
        let offset = u32::from(v4).checked_sub(self.base)?;
        let maps = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        maps.by_offset
            .get((offset as usize).checked_sub(1)?)
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_get_stable_addresses_that_map_back() {
        let s = Synthetic::new((Ipv4Addr::new(198, 18, 0, 0), 15));
        let a = s.address_of("a.test").unwrap();
        let b = s.address_of("b.test").unwrap();
        assert_eq!(a, Ipv4Addr::new(198, 18, 0, 1));
        assert_ne!(a, b);
        assert_eq!(s.address_of("a.test"), Some(a));
        assert_eq!(s.name_of(a.into()).as_deref(), Some("a.test"));
        assert_eq!(s.name_of(Ipv4Addr::new(198, 18, 0, 99).into()), None);
        assert_eq!(s.name_of(Ipv4Addr::new(198, 18, 0, 0).into()), None);
        assert!(s.covers(Ipv4Addr::new(198, 19, 255, 255).into()));
        assert!(!s.covers(Ipv4Addr::new(198, 20, 0, 0).into()));
        assert!(!s.covers(Ipv4Addr::new(127, 0, 0, 1).into()));
    }

    #[test]
    fn a_spent_range_gives_no_address() {
        let s = Synthetic::new((Ipv4Addr::new(198, 18, 0, 0), 30));
        assert!(s.address_of("a").is_some());
        assert!(s.address_of("b").is_some());
        assert!(s.address_of("c").is_some());
        assert_eq!(s.address_of("d"), None);
    }
}
