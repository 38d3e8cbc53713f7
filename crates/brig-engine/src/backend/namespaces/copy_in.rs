//! File data written into a session by a process of the session: its copier.
//!
//! tmpfs pages are charged to the memory cgroup of the task that writes them. When
//! the daemon wrote uploads itself, a session limited to 64 MiB held hundreds of MiB
//! of them, its `memory_bytes` did not count them, and the daemon's cgroup grew
//! instead (on cgroup v1 the parent of every session's: one tenant's uploads pressed
//! on all the others). So the daemon still makes each file as before (rootfs: a new
//! `O_EXCL` temporary file resolved inside the sandbox's root, its owner set before
//! any data), but hands its descriptor to the session's copier (brig-jail's
//! `copier`, a fork of the sandbox's init, in its cgroup) and writes the bytes into a
//! pipe the copier splices from. What does not fit in the session's memory fails as
//! a write inside the session would: `memory_full` (507), the session and the daemon
//! untouched.
//!
//! A sandbox started by an older brig has no copier (its init refuses `copy_in`):
//! writes into it are refused with a clear `conflict` rather than charged to the
//! daemon again; such a session is recreated to take uploads.
//!
//! The copier is the sandbox's process, and the sandbox may stop or kill it: every
//! wait for it is bounded (`idle`), and its failure is the upload's, nothing else's.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use brig_jail::agent::{AgentConnection, AgentReply, AgentRequest, JobExit};
use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::io::Errno;

use crate::rootfs::{FillError, Filler, RootfsError};

/// The pipe's capacity: each splice of the copier moves up to this much.
const PIPE_BYTES: usize = 1 << 20;

/// A connection to a session's copier; started on the first file.
pub struct CopyIn {
    connection: AgentConnection,
    /// The pipe's write end while the copier reads it.
    pipe: Option<OwnedFd>,
    /// The copier was started and has ended (or failed): nothing more goes in.
    ended: bool,
    /// How long the copier may take nothing (or not answer).
    idle: Duration,
    buf: Vec<u8>,
}

impl CopyIn {
    /// Connects to the session's init at `socket`. Made as the daemon: the socket
    /// is root's, out of reach of the sandbox's user the file operations act as.
    pub fn connect(socket: &Path, idle: Duration) -> io::Result<CopyIn> {
        Ok(CopyIn {
            connection: AgentConnection::connect(socket, true)?,
            pipe: None,
            ended: false,
            idle,
            buf: Vec::new(),
        })
    }

    /// Starts the copier, reading from a new pipe.
    fn start(&mut self, shown: &str) -> Result<(), RootfsError> {
        let failed = |e: io::Error| RootfsError::Io {
            context: format!("starting the session's copier for {shown}"),
            source: e,
        };
        let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| failed(e.into()))?;
        // A smaller pipe (the host's pipe-max-size, or a user's pipe quota) only
        // means smaller splices.
        let _ = rustix::pipe::fcntl_setpipe_size(&write, PIPE_BYTES);
        // Only the daemon's end: the copier reads blocking.
        rustix::fs::fcntl_setfl(&write, rustix::fs::OFlags::NONBLOCK)
            .map_err(|e| failed(e.into()))?;
        self.connection
            .send(&AgentRequest::CopyIn, &[read.as_fd()])
            .map_err(failed)?;
        drop(read);
        self.ended = true;
        match self.reply(shown)? {
            AgentReply::Copying { .. } => {
                self.pipe = Some(write);
                self.ended = false;
                Ok(())
            }
            AgentReply::Error { message } if message.contains("unknown variant") => {
                Err(RootfsError::Unsupported(format!(
                    "{shown}: this session's sandbox was started by an older brig, which cannot \
                     write files charged to the session's memory; create a new session to \
                     upload files"
                )))
            }
            other => Err(unexpected(other, shown)),
        }
    }

    /// The copier's next answer, within `idle`.
    fn reply(&mut self, shown: &str) -> Result<AgentReply, RootfsError> {
        let deadline = Instant::now() + self.idle;
        loop {
            match self.connection.recv() {
                Ok(Some((reply, _))) => return Ok(reply),
                Ok(None) => {
                    return Err(RootfsError::Io {
                        context: format!("writing {shown}"),
                        source: io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "the session's sandbox closed the connection (it has exited)",
                        ),
                    })
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => {
                    return Err(RootfsError::Io {
                        context: format!("writing {shown}"),
                        source: e,
                    })
                }
            }
            if !wait(self.connection.as_fd(), PollFlags::IN, deadline) {
                return Err(self.stalled(shown));
            }
        }
    }

    fn stalled(&self, shown: &str) -> RootfsError {
        RootfsError::Busy(format!(
            "{shown}: the session's copier made no progress for {} s (--body-timeout): a \
             process in the session may hold it stopped",
            self.idle.as_secs_f64()
        ))
    }

    /// Writes all of `data` into the pipe; false if the copier has closed it (it
    /// failed or was killed: its answer says why).
    fn send_data(&self, mut data: &[u8], shown: &str) -> Result<bool, RootfsError> {
        let Some(pipe) = &self.pipe else {
            return Ok(false);
        };
        while !data.is_empty() {
            match rustix::io::write(pipe, data) {
                Ok(n) => data = &data[n..],
                Err(Errno::INTR) => {}
                Err(Errno::AGAIN) => {
                    if !wait(pipe.as_fd(), PollFlags::OUT, Instant::now() + self.idle) {
                        return Err(self.stalled(shown));
                    }
                }
                Err(Errno::PIPE) => return Ok(false),
                Err(e) => {
                    return Err(RootfsError::Io {
                        context: format!("writing {shown}"),
                        source: e.into(),
                    })
                }
            }
        }
        Ok(true)
    }

    /// What the copier's answer to a `copy_file` means.
    fn outcome(&mut self, reply: AgentReply, shown: &str) -> Result<u64, RootfsError> {
        match reply {
            AgentReply::Copied { bytes } => Ok(bytes),
            AgentReply::CopyFailed {
                bytes, errno: 0, ..
            } => {
                // The input ended short (the daemon closed the pipe): the caller
                // sees the count.
                self.ended = true;
                Ok(bytes)
            }
            AgentReply::CopyFailed { errno, .. } => {
                self.ended = true;
                Err(crate::rootfs::write_errno(errno, shown))
            }
            AgentReply::CopyEnded { exit } => {
                self.ended = true;
                Err(ended(exit, shown))
            }
            other => {
                self.ended = true;
                Err(unexpected(other, shown))
            }
        }
    }
}

impl Filler for CopyIn {
    fn fill(
        &mut self,
        file: &File,
        input: &mut dyn Read,
        len: Option<u64>,
        shown: &str,
    ) -> Result<u64, FillError> {
        if self.ended {
            return Err(FillError::Output(RootfsError::Io {
                context: format!("writing {shown}"),
                source: io::Error::other("the session's copier has ended"),
            }));
        }
        if self.pipe.is_none() {
            self.start(shown).map_err(FillError::Output)?;
        }
        self.connection
            .send(&AgentRequest::CopyFile { bytes: len }, &[file.as_fd()])
            .map_err(|e| {
                FillError::Output(RootfsError::Io {
                    context: format!("writing {shown}"),
                    source: e,
                })
            })?;
        if self.buf.is_empty() {
            self.buf = vec![0; PIPE_BYTES];
        }
        let mut buf = std::mem::take(&mut self.buf);
        let mut sent = 0u64;
        let mut input_failed = None;
        loop {
            let want = len.map_or(buf.len(), |len| (len - sent).min(buf.len() as u64) as usize);
            if want == 0 {
                break;
            }
            let n = match input.read(&mut buf[..want]) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    input_failed = Some(e);
                    break;
                }
            };
            match self.send_data(&buf[..n], shown) {
                Ok(true) => sent += n as u64,
                // The copier stopped reading: its answer says why.
                Ok(false) => break,
                Err(e) => {
                    self.buf = buf;
                    self.ended = true;
                    return Err(FillError::Output(e));
                }
            }
        }
        self.buf = buf;
        if len.is_none_or(|len| sent < len) {
            // The end of the data, for a copier reading up to it (or short of what
            // it was told: it answers with what it got).
            self.pipe = None;
        }
        if let Some(e) = input_failed {
            self.ended = true;
            return Err(FillError::Input(e));
        }
        let reply = self.reply(shown).map_err(FillError::Output)?;
        let copied = self.outcome(reply, shown).map_err(FillError::Output)?;
        if self.pipe.is_none() {
            self.ended = true;
        }
        Ok(copied)
    }
}

/// Waits until `fd` is ready for `flags` or `deadline` passes; false on the latter.
fn wait(fd: std::os::fd::BorrowedFd<'_>, flags: PollFlags, deadline: Instant) -> bool {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let timeout = Timespec {
            tv_sec: left.as_secs() as i64,
            tv_nsec: i64::from(left.subsec_nanos()),
        };
        let mut fds = [PollFd::new(&fd, flags)];
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(0) | Err(Errno::INTR) => continue,
            // Ready, or an error or hangup the next call reports.
            Ok(_) | Err(_) => return true,
        }
    }
}

/// The copier ended without answering: killed. By the OOM killer as a rule (it
/// starts with the highest score, so a write its memory limit cannot take kills it
/// first); a process of the session could have too.
fn ended(exit: JobExit, shown: &str) -> RootfsError {
    match exit.signal {
        Some(9) => crate::rootfs::out_of_memory(shown),
        _ => RootfsError::Io {
            context: format!("writing {shown}"),
            source: io::Error::other(format!(
                "the session's copier ended before it was done ({exit:?})"
            )),
        },
    }
}

fn unexpected(reply: AgentReply, shown: &str) -> RootfsError {
    RootfsError::Io {
        context: format!("writing {shown}"),
        source: io::Error::other(format!("the session's init answered {reply:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What an init of an older brig answers `copy_in` with: its request enum has no
    /// such variant (serde's words, as its agent sends them).
    #[test]
    fn a_sandbox_whose_init_predates_the_copier_refuses_clearly() {
        use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketAddrUnix, SocketType};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.sock");
        let listener =
            rustix::net::socket(AddressFamily::UNIX, SocketType::SEQPACKET, None).unwrap();
        rustix::net::bind(&listener, &SocketAddrUnix::new(&path).unwrap()).unwrap();
        rustix::net::listen(&listener, 1).unwrap();
        let server = std::thread::spawn(move || {
            let conn = rustix::net::accept(&listener).unwrap();
            let mut buf = vec![0u8; 1 << 16];
            let (n, _) = rustix::net::recv(&conn, &mut buf[..], RecvFlags::empty()).unwrap();
            let reply = serde_json::json!({"type": "error", "message":
                "bad request: unknown variant `copy_in`, expected one of `exec`, `signal`, \
                 `wait`, `jobs`, `ping`, `upper`, `scratch`, `keep_writes`, `shutdown` at \
                 line 1 column 16"});
            rustix::net::send(
                &conn,
                &serde_json::to_vec(&reply).unwrap(),
                SendFlags::empty(),
            )
            .unwrap();
            String::from_utf8_lossy(&buf[..n]).into_owned()
        });
        let mut copier = CopyIn::connect(&path, Duration::from_secs(10)).unwrap();
        let file = tempfile::tempfile().unwrap();
        let result = copier.fill(&file, &mut &b"data"[..], None, "/workspace/x");
        assert_eq!(server.join().unwrap(), r#"{"op":"copy_in"}"#);
        let Err(FillError::Output(e)) = result else {
            panic!("{result:?}");
        };
        assert!(matches!(e, RootfsError::Unsupported(_)), "{e:?}");
        assert_eq!(e.code(), crate::fault::ErrorCode::Conflict);
        assert!(e.to_string().contains("older brig"), "{e}");
        // Nothing was written: the daemon never falls back to writing it itself.
        assert_eq!(file.metadata().unwrap().len(), 0);
    }
}
