//! The sandbox's network: a fresh network namespace whose only interface is `lo`.
//! A new namespace starts with `lo` down; it is brought up so programs can use
//! 127.0.0.1 among themselves. There is no route anywhere else.
//!
//! With egress ([`EgressSetup`]) the only way out is a socket brig created inside
//! that namespace (from a thread that joins it) and serves from outside: a proxy,
//! a DNS resolver, and optionally transparent capture of TCP to synthetic addresses.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, OwnedFd};

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

/// A socket brig makes inside a sandbox's network namespace (see [`EgressSetup`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listen {
    /// A listening TCP socket.
    Tcp(SocketAddrV4),
    /// A bound UDP socket.
    Udp(SocketAddrV4),
}

/// Transparent capture: TCP from the sandbox to any port of `range` is redirected,
/// inside its own namespace, to `127.0.0.1:to_port` (a [`Listen::Tcp`] brig serves),
/// which recovers the original destination with `SO_ORIGINAL_DST`. `range` is made
/// local to `lo` (so a connect does not fail with "no route" first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capture {
    pub range: (Ipv4Addr, u8),
    pub to_port: u16,
}

/// The way out of a sandbox with [`brig_policy::NetworkMode::Egress`]: the sockets
/// brig creates inside the sandbox's network namespace, and who serves them from
/// outside it. Nothing else leaves the namespace: it has no interface but `lo`.
pub struct EgressSetup {
    pub listen: Vec<Listen>,
    pub capture: Option<Capture>,
    /// Called with the sockets (non-blocking, close-on-exec, in `listen`'s order)
    /// once the sandbox's cgroup is set up and before its command can run; it may
    /// start threads (the process never clones again). An error ends the run.
    #[allow(clippy::type_complexity)]
    pub serve: Box<dyn FnOnce(Vec<OwnedFd>) -> Result<(), String> + Send>,
}

impl std::fmt::Debug for EgressSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressSetup")
            .field("listen", &self.listen)
            .field("capture", &self.capture)
            .finish_non_exhaustive()
    }
}

/// [`bind_in`] for a sandbox that is already running: a daemon's session, whose
/// listeners are bound after its start and again by a restarted daemon (then with
/// `capture` `None`: the rules stay in the namespace, which lives as long as the
/// sandbox). `init` is the pid of the sandbox's init, as its owner holds it.
pub fn bind_in_namespace_of(
    init: i32,
    listen: &[Listen],
    capture: Option<Capture>,
) -> Result<Vec<OwnedFd>, JailError> {
    bind_in(nix::unistd::Pid::from_raw(init), listen, capture)
}

/// Creates `listen`'s sockets (and `capture`'s rules) inside the network namespace
/// of `child`, from a thread of this process that joins it and ends: this process
/// stays in its own namespace and single-threaded afterwards. Needs root (setns
/// into a namespace wants CAP_SYS_ADMIN in this process's own user namespace).
pub(crate) fn bind_in(
    child: nix::unistd::Pid,
    listen: &[Listen],
    capture: Option<Capture>,
) -> Result<Vec<OwnedFd>, JailError> {
    let ns = std::fs::File::open(format!("/proc/{child}/ns/net"))
        .map_err(|e| JailError::sys("open the sandbox's network namespace", e))?;
    let listen = listen.to_vec();
    let thread = std::thread::Builder::new()
        .name("brig-netns".into())
        .spawn(move || -> Result<Vec<OwnedFd>, JailError> {
            // Only this thread moves: a network namespace is per thread, and it
            // ends right after.
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| JailError::sys("join the sandbox's network namespace", e.into()))?;
            // 127.0.0.0/8 exists only once lo is up; init brings it up again, harmlessly.
            loopback_up()?;
            if let Some(capture) = capture {
                capture_rules(capture)?;
            }
            listen
                .iter()
                .map(|l| -> Result<OwnedFd, JailError> {
                    let fd = match l {
                        Listen::Tcp(addr) => {
                            let s = std::net::TcpListener::bind(addr).map_err(|e| {
                                JailError::sys(format!("listen on {addr} in the sandbox"), e)
                            })?;
                            s.set_nonblocking(true)
                                .map_err(|e| JailError::sys("set a listener non-blocking", e))?;
                            OwnedFd::from(s)
                        }
                        Listen::Udp(addr) => {
                            let s = std::net::UdpSocket::bind(addr).map_err(|e| {
                                JailError::sys(format!("bind {addr} in the sandbox"), e)
                            })?;
                            s.set_nonblocking(true)
                                .map_err(|e| JailError::sys("set a socket non-blocking", e))?;
                            OwnedFd::from(s)
                        }
                    };
                    Ok(fd)
                })
                .collect()
        })
        .map_err(|e| JailError::sys("start the network namespace thread", e))?;
    thread
        .join()
        .map_err(|_| JailError::Setup("the network namespace thread panicked".into()))?
}

/// The capture rules, made by `ip` and `nft` started from the thread that joined
/// the sandbox's namespace (a child starts in its creator's namespaces). The
/// sandbox cannot change them: it holds no capability, and seccomp refuses it
/// netlink sockets.
fn capture_rules(capture: Capture) -> Result<(), JailError> {
    let (net, prefix) = capture.range;
    let range = format!("{net}/{prefix}");
    run_tool("ip", &["route", "add", "local", &range, "dev", "lo"], None)?;
    let rules = format!(
        "table ip brig_capture {{\n\
         \tchain output {{\n\
         \t\ttype nat hook output priority -100; policy accept;\n\
         \t\tip daddr {range} meta l4proto tcp redirect to :{port}\n\
         \t}}\n\
         }}\n",
        port = capture.to_port
    );
    run_tool("nft", &["-f", "-"], Some(rules.as_bytes()))
}

fn run_tool(tool: &str, args: &[&str], input: Option<&[u8]>) -> Result<(), JailError> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new(tool)
        .args(args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            JailError::Unsupported(format!(
                "transparent capture needs '{tool}' (iproute2, nftables): {e}"
            ))
        })?;
    if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin
            .write_all(input)
            .map_err(|e| JailError::sys(format!("write to {tool}"), e))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| JailError::sys(format!("wait for {tool}"), e))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(JailError::Setup(format!(
            "transparent capture: {tool} {} failed: {}",
            args.join(" "),
            err.trim().lines().next().unwrap_or("")
        )));
    }
    Ok(())
}
