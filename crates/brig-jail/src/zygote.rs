//! A launch zygote: one long-lived, single-threaded brig process that forks a
//! launch helper for every sandbox a daemon starts.
//!
//! Why: brig is a static-pie binary, so every process that runs it from `execve`
//! relocates its read-only-after-relocation data (`.data.rel.ro`, ~300 KiB) into
//! private pages. A session's init is cloned from its launch helper, so with a helper
//! exec'd per session every idle init carried its own copy. Forked from one zygote,
//! the helpers and the inits they clone share the zygote's relocated pages
//! copy-on-write, and an idle session costs that much less (BENCHMARKS.md).
//!
//! The daemon is multi-threaded and never forks: it execs the zygote once
//! ([`Zygote::spawn`]). The zygote does nothing but wait for requests on a
//! `SOCK_SEQPACKET` socket (its stdin): each request carries, as `SCM_RIGHTS`, the
//! three pipes that become the helper's stdin, stdout and stderr. The zygote forks
//! (it has one thread, so a fork is sound), and answers with a pidfd of the helper,
//! which the daemon uses to wait for the helper's exit and to kill a helper whose
//! launch it abandons. When the daemon
//! goes away its end of the socket closes and the zygote exits. Helpers stay the
//! zygote's children until they exit (it reaps each as it exits); the sandboxes they start are
//! re-parented to the daemon, a child subreaper, exactly as with an exec'd helper.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::process::{Child, Command, ExitCode, Stdio};

use nix::sys::socket::{
    recvmsg, sendmsg, socketpair, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags,
    SockFlag, SockType,
};

/// The request byte and the answer bytes of the protocol.
const FORK: u8 = b'F';
const FORKED: u8 = b'P';
const FAILED: u8 = b'E';

/// The daemon's handle on its zygote.
pub struct Zygote {
    socket: OwnedFd,
    child: Child,
}

/// The helper's standard streams, as the zygote is to install them.
pub struct HelperStdio<'a> {
    pub stdin: BorrowedFd<'a>,
    pub stdout: BorrowedFd<'a>,
    pub stderr: BorrowedFd<'a>,
}

impl Zygote {
    /// Execs `binary arg` as the zygote; that process must call [`serve`] at once.
    pub fn spawn(binary: &Path, arg: &str) -> std::io::Result<Zygote> {
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )?;
        let child = Command::new(binary)
            .arg(arg)
            .stdin(Stdio::from(theirs))
            .stdout(Stdio::null())
            .spawn()?;
        Ok(Zygote {
            socket: ours,
            child,
        })
    }

    /// Whether the zygote process is still there to ask.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Has the zygote fork a helper on `stdio`; returns the helper's pidfd. Blocks
    /// for the length of one fork.
    pub fn fork(&self, stdio: HelperStdio<'_>) -> std::io::Result<OwnedFd> {
        let fds = [
            stdio.stdin.as_raw_fd(),
            stdio.stdout.as_raw_fd(),
            stdio.stderr.as_raw_fd(),
        ];
        let rights = [ControlMessage::ScmRights(&fds)];
        sendmsg::<()>(
            self.socket.as_raw_fd(),
            &[IoSlice::new(&[FORK])],
            &rights,
            MsgFlags::MSG_NOSIGNAL,
            None,
        )?;
        let mut answer = [0u8; 16];
        let mut space = nix::cmsg_space!([RawFd; 1]);
        let mut iov = [IoSliceMut::new(&mut answer)];
        let message = recvmsg::<()>(
            self.socket.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )?;
        let mut pidfd = None;
        for cmsg in message.cmsgs()? {
            if let ControlMessageOwned::ScmRights(received) = cmsg {
                for fd in received {
                    // SAFETY: the kernel just installed `fd` in this process for
                    // this message; nothing else owns it.
                    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
                    pidfd.get_or_insert(owned);
                }
            }
        }
        let bytes = message.bytes;
        match (answer.first(), pidfd) {
            (Some(&FORKED), Some(pidfd)) if bytes == 1 => Ok(pidfd),
            _ if bytes == 0 => Err(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "the launch zygote exited",
            )),
            (Some(&FAILED), _) => {
                let errno = std::str::from_utf8(&answer[1..bytes])
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(libc::EIO);
                Err(std::io::Error::from_raw_os_error(errno))
            }
            _ => Err(std::io::Error::other("the launch zygote answered badly")),
        }
    }
}

impl Drop for Zygote {
    fn drop(&mut self) {
        // Closing our end tells the zygote to exit; reap it.
        let _ =
            nix::sys::socket::shutdown(self.socket.as_raw_fd(), nix::sys::socket::Shutdown::Both);
        let _ = self.child.wait();
    }
}

/// Sends SIGKILL to the process of `pidfd` (a helper the daemon gave up on).
pub fn kill(pidfd: BorrowedFd<'_>) -> std::io::Result<()> {
    rustix::process::pidfd_send_signal(pidfd, rustix::process::Signal::KILL)?;
    Ok(())
}

/// The zygote's loop, on the socket at its stdin: forks a process running `helper`
/// for every request, until the daemon closes the socket. Must run in a process
/// that has exactly one thread (called first thing in `main`).
pub fn serve(helper: fn() -> ExitCode) -> ExitCode {
    use nix::sys::signal::{SigSet, Signal};
    use nix::sys::signalfd::{SfdFlags, SignalFd};
    // SAFETY: fd 0 is the socket `Zygote::spawn` gave this process as stdin; this
    // process owns it from here on.
    let socket = unsafe { OwnedFd::from_raw_fd(0) };
    // Names that tell the processes apart in `ps` (they share the zygote's argv).
    let _ = rustix::thread::set_name(c"brig-zygote");
    // A helper is reaped as soon as it exits: SIGCHLD arrives on a signalfd that
    // the loop waits on beside the socket.
    let mut sigchld = SigSet::empty();
    sigchld.add(Signal::SIGCHLD);
    let children = match sigchld.thread_block().and_then(|()| {
        SignalFd::with_flags(&sigchld, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
    }) {
        Ok(fd) => fd,
        Err(_) => return ExitCode::FAILURE,
    };
    loop {
        let (request_ready, child_exited) = wait(socket.as_fd(), children.as_fd());
        if child_exited {
            while let Ok(Some(_)) = children.read_signal() {}
            reap_helpers();
        }
        if !request_ready {
            continue;
        }
        let mut request = [0u8; 1];
        let mut space = nix::cmsg_space!([RawFd; 3]);
        let mut iov = [IoSliceMut::new(&mut request)];
        let message = match recvmsg::<()>(
            socket.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(message) => message,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return ExitCode::FAILURE,
        };
        if message.bytes == 0 {
            // The daemon is gone.
            return ExitCode::SUCCESS;
        }
        let mut fds = Vec::new();
        if let Ok(cmsgs) = message.cmsgs() {
            for cmsg in cmsgs {
                if let ControlMessageOwned::ScmRights(received) = cmsg {
                    // SAFETY: each was just installed in this process by the kernel
                    // for this message and is owned by nothing else.
                    fds.extend(
                        received
                            .into_iter()
                            .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                    );
                }
            }
        }
        let answer = if request[0] == FORK && fds.len() == 3 {
            fork_helper(fds, &sigchld, helper)
        } else {
            Err(nix::errno::Errno::EINVAL)
        };
        let _ = match &answer {
            Ok(pidfd) => sendmsg::<()>(
                socket.as_raw_fd(),
                &[IoSlice::new(&[FORKED])],
                &[ControlMessage::ScmRights(&[pidfd.as_raw_fd()])],
                MsgFlags::MSG_NOSIGNAL,
                None,
            ),
            Err(errno) => {
                let text = format!("{}{}", FAILED as char, *errno as i32);
                sendmsg::<()>(
                    socket.as_raw_fd(),
                    &[IoSlice::new(text.as_bytes())],
                    &[],
                    MsgFlags::MSG_NOSIGNAL,
                    None,
                )
            }
        };
    }
}

/// Forks a helper on `stdio` and returns its pidfd. The child never returns.
fn fork_helper(
    stdio: Vec<OwnedFd>,
    blocked: &nix::sys::signal::SigSet,
    helper: fn() -> ExitCode,
) -> Result<OwnedFd, nix::errno::Errno> {
    // SAFETY: the zygote has one thread (see `serve`), so the child is a complete
    // copy of a consistent process; it only installs its stdio and runs `helper`.
    match unsafe { nix::unistd::fork() }? {
        nix::unistd::ForkResult::Child => {
            let _ = rustix::thread::set_name(c"brig-launch");
            for (target, fd) in stdio.iter().enumerate() {
                if nix::unistd::dup2(fd.as_raw_fd(), target as RawFd).is_err() {
                    std::process::exit(125);
                }
            }
            // fd 0, the zygote's socket, is now the helper's stdin. Every other fd of
            // the zygote goes too (the received copies, the signalfd): the sandbox's
            // init is cloned from this process without an exec, and a pipe end it
            // kept would hold the daemon's read open. Their owners are never dropped
            // in this process, which ends in `exit`.
            std::mem::forget(stdio);
            // SAFETY: closes descriptors this process owns and will not use again.
            unsafe { libc::close_range(3, libc::c_uint::MAX, 0) };
            if blocked.thread_unblock().is_err() {
                std::process::exit(125);
            }
            let code = helper();
            // `ExitCode` has no accessor: the helper reports success or 125.
            std::process::exit(if code == ExitCode::SUCCESS { 0 } else { 125 });
        }
        nix::unistd::ForkResult::Parent { child } => {
            // The child cannot be reaped before this: only `reap_helpers` waits.
            let pidfd = rustix::process::pidfd_open(
                rustix::process::Pid::from_raw(child.as_raw()).ok_or(nix::errno::Errno::ESRCH)?,
                rustix::process::PidfdFlags::empty(),
            )
            .map_err(|e| nix::errno::Errno::from_raw(e.raw_os_error()))?;
            Ok(pidfd)
        }
    }
}

/// Waits until a request (or the daemon's close) arrives on `socket`, or a helper
/// exits; says which.
fn wait(socket: BorrowedFd<'_>, children: BorrowedFd<'_>) -> (bool, bool) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut fds = [
        PollFd::new(socket, PollFlags::POLLIN),
        PollFd::new(children, PollFlags::POLLIN),
    ];
    if poll(&mut fds, PollTimeout::NONE).is_err() {
        return (false, false);
    }
    let ready = |fd: &PollFd| fd.revents().is_some_and(|r| !r.is_empty());
    (ready(&fds[0]), ready(&fds[1]))
}

fn reap_helpers() {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    while let Ok(status) = waitpid(None, Some(WaitPidFlag::WNOHANG)) {
        if status == WaitStatus::StillAlive {
            break;
        }
    }
}
