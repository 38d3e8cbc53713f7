//! The sandbox's network: a fresh network namespace whose only interface is `lo`.
//! A new namespace starts with `lo` down; it is brought up so programs can use
//! 127.0.0.1 among themselves. There is no route anywhere else.

use std::os::fd::AsRawFd;

use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};

use crate::JailError;

pub fn loopback_up() -> Result<(), JailError> {
    let sock = socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| JailError::sys("socket for loopback setup", e.into()))?;
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads the flags of the interface named in `req` into it.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } < 0 {
        return Err(JailError::last_os("read loopback flags"));
    }
    // SAFETY: the union member ifru_flags is the one SIOCGIFFLAGS just filled in.
    unsafe { req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short };
    // SAFETY: SIOCSIFFLAGS reads `req`, a valid ifreq for "lo".
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } < 0 {
        return Err(JailError::last_os("bring loopback up"));
    }
    Ok(())
}
