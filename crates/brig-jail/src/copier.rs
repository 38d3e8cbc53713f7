//! A session's copier: the process in the sandbox that fills files the API writes.
//!
//! tmpfs pages (a session's /tmp and /workspace, an image root's upper layer) are
//! charged to the memory cgroup of the task that writes them. Written by the daemon,
//! an upload was the daemon's memory: past the session's limit, missing from its
//! `memory_bytes`, and on cgroup v1 (sessions' cgroups below the daemon's) pressing
//! on every other session. So the daemon still makes and checks each file (a new
//! `O_EXCL` temporary file, its owner set, resolved inside the sandbox's root: see
//! brig-server's rootfs), but the bytes are written by this fork of init, inside the
//! sandbox's cgroup, from a pipe the daemon writes the body into. A file that does
//! not fit fails here (ENOMEM, or an OOM kill, which init reports) as a write by the
//! sandbox would, and the pages of what fits are the session's.
//!
//! The copier gets only the pipe and, per file, the one descriptor to fill: never a
//! directory or a path. It is a fork of init, so non-dumpable like it (no process of
//! the sandbox can ptrace it or open its descriptors through /proc). A process of
//! the sandbox may signal it (same user), which fails the upload and nothing else.
//! It serves one connection, taken over from init, until the daemon closes it or a
//! copy fails; init reaps it and tells the connection how it ended.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use nix::errno::Errno;
use nix::fcntl::SpliceFFlags;
use nix::poll::{PollFd, PollFlags, PollTimeout};

use crate::agent::{recv_packet, send_packet, AgentReply, AgentRequest, MAX_MESSAGE};
use crate::sys;

/// Bytes moved per splice: the size of the pipe the daemon makes.
const CHUNK: usize = 1 << 20;

/// Serves `socket` (a connection init accepted) until it closes or a copy fails,
/// copying from `source` into the files that come with `copy_file`; then exits.
pub(crate) fn serve(socket: OwnedFd, source: OwnedFd) -> ! {
    // A file past the sandbox's RLIMIT_FSIZE fails with EFBIG, reported, rather
    // than killing the copier with no word on why.
    // SAFETY: ignoring a signal changes no memory; the copier is single-threaded.
    unsafe {
        let _ = nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGXFSZ,
            nix::sys::signal::SigHandler::SigIgn,
        );
    }
    let mut buf = vec![0u8; MAX_MESSAGE + 1];
    let mut data = Vec::new();
    loop {
        // The socket is non-blocking (init's); the copier has nothing else to do.
        let mut fds = [PollFd::new(socket.as_fd(), PollFlags::POLLIN)];
        match nix::poll::poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(_) => sys::exit_now(1),
        }
        let (bytes, target) = match recv_packet::<AgentRequest>(socket.as_raw_fd(), &mut buf) {
            Ok(Some((AgentRequest::CopyFile { bytes }, mut fds))) if fds.len() == 1 => {
                (bytes, fds.remove(0))
            }
            Ok(Some(_)) => {
                let refusal = AgentReply::Error {
                    message: "a copier takes copy_file with one descriptor, nothing else".into(),
                };
                if send_packet(socket.as_raw_fd(), &refusal, &[]).is_err() {
                    sys::exit_now(1);
                }
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            // The daemon is done (or gone).
            Ok(None) | Err(_) => sys::exit_now(0),
        };
        let (reply, failed) = match copy(&source, &target, bytes, &mut data) {
            Ok(bytes) => (AgentReply::Copied { bytes }, false),
            Err(failure) => (failure.reply(), true),
        };
        drop(target);
        if send_packet(socket.as_raw_fd(), &reply, &[]).is_err() || failed {
            // Exiting closes the source: a daemon still writing into it stops.
            sys::exit_now(u8::from(failed).into());
        }
    }
}

struct Failure {
    copied: u64,
    errno: Errno,
    message: String,
}

impl Failure {
    fn reply(self) -> AgentReply {
        AgentReply::CopyFailed {
            bytes: self.copied,
            errno: self.errno as i32,
            message: self.message,
        }
    }
}

/// Copies `bytes` (or everything up to the end) from `source` into `target`.
/// Spliced, so the data is copied once, from the pipe's pages into the file's; a
/// target whose filesystem cannot take a splice is written through `data`.
fn copy(
    source: &OwnedFd,
    target: &OwnedFd,
    bytes: Option<u64>,
    data: &mut Vec<u8>,
) -> Result<u64, Failure> {
    let mut copied = 0u64;
    let mut spliced = true;
    let fail = |copied: u64, errno: Errno| Failure {
        copied,
        errno,
        message: format!("copy into the file: {}", errno.desc()),
    };
    loop {
        let want = match bytes {
            Some(total) => (total - copied).min(CHUNK as u64) as usize,
            None => CHUNK,
        };
        if want == 0 {
            return Ok(copied);
        }
        let moved = if spliced {
            match nix::fcntl::splice(source, None, target, None, want, SpliceFFlags::empty()) {
                Ok(n) => n,
                Err(Errno::EINTR) => continue,
                Err(Errno::EINVAL) if copied == 0 => {
                    spliced = false;
                    continue;
                }
                Err(e) => return Err(fail(copied, e)),
            }
        } else {
            data.resize(want, 0);
            let n = match nix::unistd::read(source.as_raw_fd(), &mut data[..want]) {
                Ok(n) => n,
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(fail(copied, e)),
            };
            let mut written = 0;
            while written < n {
                match nix::unistd::write(target, &data[written..n]) {
                    Ok(w) => written += w,
                    Err(Errno::EINTR) => continue,
                    Err(e) => return Err(fail(copied + written as u64, e)),
                }
            }
            n
        };
        if moved == 0 {
            return match bytes {
                Some(total) if copied < total => Err(Failure {
                    copied,
                    errno: Errno::UnknownErrno,
                    message: format!("the data ended after {copied} of {total} bytes"),
                }),
                _ => Ok(copied),
            };
        }
        copied += moved as u64;
    }
}
