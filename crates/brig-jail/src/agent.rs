//! A session's init as an exec agent, and the client the daemon talks to it with.
//!
//! In a session the sandbox's PID 1 does not run one command: it serves requests on
//! a unix socket (SOCK_SEQPACKET, one JSON message per packet, descriptors passed
//! with SCM_RIGHTS). The socket was bound by the launcher on the host, in the
//! daemon's data dir, before the sandbox was made: its path is invisible from inside
//! (another mount namespace) and only root can connect. Because init serves the
//! socket itself, the sandbox does not depend on the daemon: a restarted daemon
//! reconnects to the same path.
//!
//! An exec is a vfork-style clone of init, so it is already inside every namespace,
//! the cgroup, Landlock and seccomp: no setns, no new mounts. The daemon passes the
//! three stdio descriptors (pipes or files it made), so output never flows through
//! init.
//!
//! Requests and replies:
//! - `exec` (+ stdin, stdout, stderr) -> `started`, later `exited` on the same
//!   connection if it is still open; or `exec_failed` at once.
//! - `signal` -> `done`; the signal goes to the job's process group.
//! - `wait` -> `exited` when the job has ended (at once if it has).
//! - `jobs` -> `jobs`; `ping` -> `pong`; `upper` -> `done` + the upper layer's fd
//!   (an image root); `scratch` -> `scratch {names}` + one fd per name: the private
//!   directories a session on the host's system dirs writes (`tmp`, `workspace`).
//!   Both are detached mounts taken while the root was built (see
//!   `mounts::Writes`), for snapshots. The daemon only reads them by
//!   descriptors (never attaching them), so init keeps handing out the same ones.
//! - `copy_in` + a pipe's read end -> `copying`: init forks a copier, which takes
//!   the connection over (see `copier`) and then answers `copy_file {bytes}` + a
//!   file -> `copied {bytes}` or `copy_failed`; when the copier has ended init says
//!   `copy_ended` (how it ended) and closes the connection. Files the API writes
//!   into a sandbox are filled this way, by a process in its cgroup: tmpfs pages
//!   are charged to the writer's memory cgroup, so written by the daemon they were
//!   the daemon's, past the session's memory limit and out of its accounting.
//! - `shutdown` -> init kills everything and exits.

use std::collections::{BTreeMap, VecDeque};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SigSet, SigmaskHow};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::socket::{
    accept4, recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag,
};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use crate::mounts::Writes;
use crate::sys;

/// Signals by name and number, for callers of [`AgentRequest::Signal`].
pub use nix::sys::signal::Signal;

/// The largest request or reply (argv and env travel in it; data never does).
pub const MAX_MESSAGE: usize = 192 << 10;
/// Finished jobs whose status init keeps for `wait` and `jobs` (oldest dropped first).
const KEEP_FINISHED: usize = 4096;
/// Connections served at once; more wait in the listen backlog.
const MAX_CONNECTIONS: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum AgentRequest {
    /// Run `argv` (searched in the PATH of `env`) with `env` (`K=V`) in `cwd`; stdin,
    /// stdout and stderr come with the message.
    Exec {
        argv: Vec<String>,
        env: Vec<String>,
        cwd: String,
        /// Kill the job (its process group) if this connection closes before the job
        /// has ended: for a command whose requester waits for it (a synchronous or
        /// streamed exec), so that a daemon that dies, or drops the request when its
        /// client hangs up, does not leave it running past its timeout. Left out of
        /// the message when false: inits started by older daemons refuse the field.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        bound: bool,
    },
    Signal {
        job: u64,
        signal: i32,
    },
    Wait {
        job: u64,
    },
    Jobs,
    Ping,
    Upper,
    Scratch,
    /// Start a copier reading from the descriptor that comes with it (see `copier`).
    CopyIn,
    /// To a copier: copy `bytes` from its source into the file that comes with it,
    /// or everything up to the source's end when `None`.
    CopyFile {
        bytes: Option<u64>,
    },
    Shutdown,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobStatus {
    pub job: u64,
    pub pid: i32,
    /// `None` while it runs.
    pub exit: Option<JobExit>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobExit {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AgentReply {
    Started {
        job: u64,
        /// In the sandbox's pid namespace.
        pid: i32,
    },
    ExecFailed {
        message: String,
        /// What a shell would exit with: 127 not found, 126 not executable.
        exit_code: i32,
    },
    Exited {
        job: u64,
        #[serde(flatten)]
        exit: JobExit,
    },
    Jobs {
        jobs: Vec<JobStatus>,
    },
    Pong {
        running: usize,
    },
    Done,
    /// The descriptors that come with it, in the order of `names`.
    Scratch {
        names: Vec<String>,
    },
    Error {
        message: String,
    },
    /// The copier `copy_in` asked for runs, and serves this connection from now on.
    Copying {
        /// In the sandbox's pid namespace.
        pid: i32,
    },
    /// A `copy_file` is done: the file holds what was asked for.
    Copied {
        bytes: u64,
    },
    /// A `copy_file` failed after `bytes`; the copier has ended (its source is
    /// closed, so whatever still writes into it learns at once).
    CopyFailed {
        bytes: u64,
        /// The errno of the failed write or read; 0 when the source ended short.
        errno: i32,
        message: String,
    },
    /// From init: the copier of this connection has ended, as this says (an OOM
    /// kill is `signal: 9`).
    CopyEnded {
        #[serde(flatten)]
        exit: JobExit,
    },
}

/// Sends one message with `fds` attached.
pub(crate) fn send_packet<T: Serialize>(
    socket: RawFd,
    message: &T,
    fds: &[RawFd],
) -> io::Result<()> {
    let bytes = serde_json::to_vec(message).map_err(io::Error::other)?;
    if bytes.len() > MAX_MESSAGE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "message of {} bytes is over the {} byte limit (argv and env too large)",
                bytes.len(),
                MAX_MESSAGE
            ),
        ));
    }
    let iov = [io::IoSlice::new(&bytes)];
    let cmsg = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &cmsg };
    sendmsg::<()>(socket, &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None)?;
    Ok(())
}

/// Receives one message and its descriptors; `Ok(None)` at end of stream.
pub(crate) fn recv_packet<T: for<'de> Deserialize<'de>>(
    socket: RawFd,
    buf: &mut [u8],
) -> io::Result<Option<(T, Vec<OwnedFd>)>> {
    let mut space = nix::cmsg_space!([RawFd; 4]);
    let mut iov = [io::IoSliceMut::new(buf)];
    let msg = recvmsg::<()>(
        socket,
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for cmsg in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(received) = cmsg {
            // SAFETY: SCM_RIGHTS just installed these descriptors in this process;
            // nothing else owns them.
            fds.extend(
                received
                    .into_iter()
                    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
            );
        }
    }
    let (bytes, truncated) = (msg.bytes, msg.flags.contains(MsgFlags::MSG_TRUNC));
    if bytes == 0 {
        return Ok(None);
    }
    if truncated || msg.flags.contains(MsgFlags::MSG_CTRUNC) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "message too large",
        ));
    }
    let value = serde_json::from_slice(&buf[..bytes])
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    Ok(Some((value, fds)))
}

/// The daemon's side of one connection to a session's init.
#[derive(Debug)]
pub struct AgentConnection {
    socket: OwnedFd,
    buf: Vec<u8>,
}

impl AgentConnection {
    /// Connects to the agent listening at `path`. With `nonblocking`, `send` and
    /// `recv` fail with `WouldBlock` instead of waiting (for async callers).
    pub fn connect(path: &Path, nonblocking: bool) -> io::Result<AgentConnection> {
        use nix::sys::socket::{connect, socket, AddressFamily, SockType, UnixAddr};
        let mut flags = SockFlag::SOCK_CLOEXEC;
        if nonblocking {
            flags |= SockFlag::SOCK_NONBLOCK;
        }
        let socket = socket(AddressFamily::Unix, SockType::SeqPacket, flags, None)?;
        let addr = UnixAddr::new(path)?;
        // A non-blocking connect on a unix socket completes at once or fails with
        // EAGAIN when the backlog is full.
        connect(socket.as_raw_fd(), &addr)?;
        Ok(AgentConnection {
            socket,
            buf: vec![0; MAX_MESSAGE + 1],
        })
    }

    pub fn send(&self, request: &AgentRequest, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
        let raw: Vec<RawFd> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
        send_packet(self.socket.as_raw_fd(), request, &raw)
    }

    /// The next reply; `Ok(None)` when init closed the connection (it exited).
    pub fn recv(&mut self) -> io::Result<Option<(AgentReply, Vec<OwnedFd>)>> {
        recv_packet(self.socket.as_raw_fd(), &mut self.buf)
    }
}

impl AsFd for AgentConnection {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }
}

impl AsRawFd for AgentConnection {
    fn as_raw_fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }
}

// ---------------------------------------------------------------------------------
// Init's side.

struct Job {
    pid: Pid,
    exit: Option<JobExit>,
    /// Connections to tell when it ends: the one that started it and any waiters.
    notify: Vec<u64>,
    /// The connection whose closing kills it (`bound` execs).
    bound_to: Option<u64>,
}

struct Connection {
    socket: OwnedFd,
    /// The copier serving it: init neither reads it nor answers on it until that
    /// copier has ended.
    copier: Option<Pid>,
}

/// What init serves with: the listening socket and what the sandbox writes.
pub(crate) struct Agent {
    pub listener: OwnedFd,
    pub writes: crate::mounts::Writes,
    /// Jobs start with the highest OOM score (see `oom`).
    pub oom: Option<crate::oom::OomScore>,
}

/// Serves requests until told to shut down; never returns. Init is single-threaded
/// and everything here is non-blocking except the poll.
pub(crate) fn serve(agent: Agent) -> ! {
    let mut watched = SigSet::empty();
    watched.add(Signal::SIGCHLD);
    if nix::sys::signal::sigprocmask(SigmaskHow::SIG_BLOCK, Some(&watched), None).is_err() {
        sys::exit_now(125);
    }
    let signals =
        match SignalFd::with_flags(&watched, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK) {
            Ok(fd) => fd,
            Err(_) => sys::exit_now(125),
        };
    let mut state = AgentState {
        agent,
        jobs: BTreeMap::new(),
        finished: VecDeque::new(),
        connections: BTreeMap::new(),
        next_job: 1,
        next_connection: 1,
        buf: vec![0; MAX_MESSAGE + 1],
    };
    loop {
        state.poll_once(&signals);
    }
}

struct AgentState {
    agent: Agent,
    jobs: BTreeMap<u64, Job>,
    /// Finished job ids, oldest first, to bound what is kept.
    finished: VecDeque<u64>,
    connections: BTreeMap<u64, Connection>,
    next_job: u64,
    next_connection: u64,
    buf: Vec<u8>,
}

impl AgentState {
    fn poll_once(&mut self, signals: &SignalFd) {
        let ids: Vec<u64> = self
            .connections
            .iter()
            .filter(|(_, c)| c.copier.is_none())
            .map(|(id, _)| *id)
            .collect();
        let mut fds = Vec::with_capacity(2 + ids.len());
        fds.push(PollFd::new(signals.as_fd(), PollFlags::POLLIN));
        let accepting = self.connections.len() < MAX_CONNECTIONS;
        if accepting {
            fds.push(PollFd::new(self.agent.listener.as_fd(), PollFlags::POLLIN));
        }
        for id in &ids {
            fds.push(PollFd::new(
                self.connections[id].socket.as_fd(),
                PollFlags::POLLIN,
            ));
        }
        match nix::poll::poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(_) => sys::exit_now(125),
        }
        let ready: Vec<bool> = fds
            .iter()
            .map(|fd| fd.revents().is_some_and(|r| !r.is_empty()))
            .collect();
        drop(fds);
        if ready[0] {
            while let Ok(Some(_)) = signals.read_signal() {}
            self.reap();
        }
        let offset = if accepting {
            if ready[1] && !self.accept() {
                // The listening socket is broken: nobody can reach this sandbox
                // again, and polling it would spin.
                let _ = nix::sys::signal::kill(Pid::from_raw(-1), Signal::SIGKILL);
                sys::exit_now(125);
            }
            2
        } else {
            1
        };
        for (i, id) in ids.iter().enumerate() {
            if ready[offset + i] {
                self.serve_connection(*id);
            }
        }
    }

    /// Accepts every pending connection; false if the listener itself has failed.
    fn accept(&mut self) -> bool {
        use nix::errno::Errno;
        let flags = SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK;
        loop {
            match accept4(self.agent.listener.as_raw_fd(), flags) {
                Ok(fd) => {
                    // SAFETY: accept4 returned a new descriptor that nothing else owns.
                    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
                    let id = self.next_connection;
                    self.next_connection += 1;
                    self.connections.insert(
                        id,
                        Connection {
                            socket,
                            copier: None,
                        },
                    );
                    if self.connections.len() >= MAX_CONNECTIONS {
                        return true;
                    }
                }
                Err(Errno::EAGAIN) | Err(Errno::EINTR) | Err(Errno::ECONNABORTED) => return true,
                // Out of descriptors or memory: try again at the next wakeup.
                Err(Errno::EMFILE) | Err(Errno::ENFILE) | Err(Errno::ENOBUFS)
                | Err(Errno::ENOMEM) => return true,
                Err(_) => return false,
            }
        }
    }

    fn serve_connection(&mut self, id: u64) {
        loop {
            // A connection lent to a copier is the copier's to read from now: what
            // comes next (its first `copy_file`) must not be taken here.
            let Some(connection) = self.connections.get(&id).filter(|c| c.copier.is_none()) else {
                return;
            };
            let fd = connection.socket.as_raw_fd();
            match recv_packet::<AgentRequest>(fd, &mut self.buf) {
                Ok(Some((request, fds))) => self.handle(id, request, fds),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                    self.reply(
                        id,
                        &AgentReply::Error {
                            message: format!("bad request: {e}"),
                        },
                    );
                }
                // EOF or a broken connection.
                Ok(None) | Err(_) => {
                    self.close(id);
                    return;
                }
            }
        }
    }

    fn reply(&mut self, id: u64, reply: &AgentReply) {
        self.reply_with(id, reply, &[]);
    }

    fn reply_with(&mut self, id: u64, reply: &AgentReply, fds: &[RawFd]) {
        let Some(connection) = self.connections.get(&id) else {
            return;
        };
        if send_packet(connection.socket.as_raw_fd(), reply, fds).is_err() {
            // A full or broken socket: the daemon is gone or not reading.
            self.close(id);
        }
    }

    /// Forgets a connection. Jobs it started keep running, except those bound to it,
    /// which are killed: nobody waits for them any more.
    fn close(&mut self, id: u64) {
        self.connections.remove(&id);
        for job in self.jobs.values() {
            if job.bound_to == Some(id) && job.exit.is_none() {
                let _ = nix::sys::signal::kill(Pid::from_raw(-job.pid.as_raw()), Signal::SIGKILL);
            }
        }
    }

    fn handle(&mut self, id: u64, request: AgentRequest, fds: Vec<OwnedFd>) {
        match request {
            AgentRequest::Exec {
                argv,
                env,
                cwd,
                bound,
            } => {
                let reply = self.exec(id, &argv, &env, &cwd, bound, fds);
                self.reply(id, &reply);
            }
            AgentRequest::Signal { job, signal } => {
                let reply = match (self.jobs.get(&job), Signal::try_from(signal)) {
                    (None, _) => unknown_job(job),
                    (_, Err(_)) => AgentReply::Error {
                        message: format!("invalid signal {signal}"),
                    },
                    (Some(Job { exit: Some(_), .. }), _) => AgentReply::Done,
                    (Some(running), Ok(signal)) => {
                        // The job leads its own process group (setsid): signal the
                        // whole group, so a shell's children get it too.
                        let _ =
                            nix::sys::signal::kill(Pid::from_raw(-running.pid.as_raw()), signal);
                        AgentReply::Done
                    }
                };
                self.reply(id, &reply);
            }
            AgentRequest::Wait { job } => match self.jobs.get_mut(&job) {
                None => self.reply(id, &unknown_job(job)),
                Some(Job {
                    exit: Some(exit), ..
                }) => {
                    let reply = AgentReply::Exited { job, exit: *exit };
                    self.reply(id, &reply);
                }
                Some(running) => running.notify.push(id),
            },
            AgentRequest::Jobs => {
                let jobs = self
                    .jobs
                    .iter()
                    .map(|(job, state)| JobStatus {
                        job: *job,
                        pid: state.pid.as_raw(),
                        exit: state.exit,
                    })
                    .collect();
                self.reply(id, &AgentReply::Jobs { jobs });
            }
            AgentRequest::Ping => {
                let running = self.jobs.values().filter(|j| j.exit.is_none()).count();
                self.reply(id, &AgentReply::Pong { running });
            }
            AgentRequest::Upper => match &self.agent.writes {
                Writes::Upper(upper) => {
                    let upper = upper.as_raw_fd();
                    self.reply_with(id, &AgentReply::Done, &[upper])
                }
                _ => self.reply(
                    id,
                    &AgentReply::Error {
                        message: "this session has no writable upper layer (not an image root)"
                            .into(),
                    },
                ),
            },
            AgentRequest::Scratch => match &self.agent.writes {
                Writes::Scratch(dirs) => {
                    let names = dirs.iter().map(|(dir, _)| dir.name().to_string()).collect();
                    let fds: Vec<RawFd> = dirs.iter().map(|(_, fd)| fd.as_raw_fd()).collect();
                    self.reply_with(id, &AgentReply::Scratch { names }, &fds)
                }
                _ => self.reply(
                    id,
                    &AgentReply::Error {
                        message: "this session keeps no private /tmp and /workspace to snapshot"
                            .into(),
                    },
                ),
            },
            AgentRequest::CopyIn => match self.start_copier(id, fds) {
                Ok(pid) => {
                    if let Some(connection) = self.connections.get_mut(&id) {
                        connection.copier = Some(pid);
                    }
                    // Sent by init before the copier may answer anything: the
                    // daemon asks it nothing before this.
                    self.reply(id, &AgentReply::Copying { pid: pid.as_raw() });
                }
                Err(message) => self.reply(id, &AgentReply::Error { message }),
            },
            AgentRequest::CopyFile { .. } => self.reply(
                id,
                &AgentReply::Error {
                    message: "copy_file goes to a copier (ask copy_in first)".into(),
                },
            ),
            AgentRequest::Shutdown => {
                let _ = nix::sys::signal::kill(Pid::from_raw(-1), Signal::SIGKILL);
                sys::exit_now(0);
            }
        }
    }

    /// Forks the copier of connection `id`, reading from the one descriptor in
    /// `fds`. A plain fork: init is single-threaded. The copier starts with a
    /// command's OOM score, so that a copy the memory limit cannot take is what the
    /// kernel kills rather than init.
    fn start_copier(&mut self, id: u64, mut fds: Vec<OwnedFd>) -> Result<Pid, String> {
        if fds.len() != 1 {
            return Err(format!(
                "copy_in needs 1 descriptor (the source), got {}",
                fds.len()
            ));
        }
        if !self.connections.contains_key(&id) {
            return Err("no such connection".into());
        }
        let fork = || {
            // SAFETY: init is single-threaded, so the child may run any code; it
            // never returns from `copier::serve`.
            unsafe { nix::unistd::fork() }
        };
        let forked = match &mut self.agent.oom {
            Some(oom) => oom.for_command(fork),
            None => fork(),
        };
        match forked {
            Ok(nix::unistd::ForkResult::Child) => {
                // Init's other connections and its listener: kept open by the copier,
                // a connection init closes would not end for the daemon.
                let mut connections = std::mem::take(&mut self.connections);
                let own = connections.remove(&id);
                drop(connections);
                // Never dropped: the copier ends with _exit.
                let _ = nix::unistd::close(self.agent.listener.as_raw_fd());
                match own {
                    Some(connection) => crate::copier::serve(connection.socket, fds.remove(0)),
                    None => sys::exit_now(1),
                }
            }
            // Init's copy of the source closes here: the copier holds the only one.
            Ok(nix::unistd::ForkResult::Parent { child }) => Ok(child),
            Err(e) => Err(format!("fork a copier: {e}")),
        }
    }

    /// The copier `pid` has ended: its connection hears how, and is done.
    fn copier_ended(&mut self, pid: Pid, exit: JobExit) -> bool {
        let Some(id) = self
            .connections
            .iter()
            .find(|(_, c)| c.copier == Some(pid))
            .map(|(id, _)| *id)
        else {
            return false;
        };
        self.reply(id, &AgentReply::CopyEnded { exit });
        self.close(id);
        true
    }

    fn exec(
        &mut self,
        id: u64,
        argv: &[String],
        env: &[String],
        cwd: &str,
        bound: bool,
        fds: Vec<OwnedFd>,
    ) -> AgentReply {
        let bad = |message: String| AgentReply::Error { message };
        if fds.len() != 3 {
            return bad(format!(
                "exec needs 3 descriptors (stdin, stdout, stderr), got {}",
                fds.len()
            ));
        }
        if argv.is_empty() || argv[0].is_empty() {
            return bad("empty command".into());
        }
        let to_c = |s: &str| CString::new(s).map_err(|_| bad(format!("NUL byte in {s:?}")));
        let prepared = (|| {
            let argv_c = argv
                .iter()
                .map(|a| to_c(a))
                .collect::<Result<Vec<_>, _>>()?;
            let env_c = env.iter().map(|e| to_c(e)).collect::<Result<Vec<_>, _>>()?;
            let path = env
                .iter()
                .find_map(|e| e.strip_prefix("PATH="))
                .unwrap_or("/usr/local/bin:/usr/bin:/bin");
            let candidates = crate::supervisor::exec_candidates(&argv[0], path);
            Ok((argv_c, env_c, to_c(cwd)?, candidates))
        })();
        let (argv_c, env_c, cwd_c, candidates) = match prepared {
            Ok(p) => p,
            Err(reply) => return reply,
        };
        let spawn = Spawn {
            argv: &argv_c,
            envp: &env_c,
            cwd: &cwd_c,
            candidates: &candidates,
            stdio: [fds[0].as_raw_fd(), fds[1].as_raw_fd(), fds[2].as_raw_fd()],
            failure: SpawnFailure::default(),
        };
        let spawned = match &mut self.agent.oom {
            Some(oom) => oom.for_command(|| spawn_job(spawn)),
            None => spawn_job(spawn),
        };
        let (pid, failure) = match spawned {
            Ok(result) => result,
            Err(e) => return bad(format!("fork: {e}")),
        };
        drop(fds);
        if let Some(failure) = failure {
            // The child has exited; reap() collects it with the next SIGCHLD.
            return failure.reply(&argv[0], cwd);
        }
        let job = self.next_job;
        self.next_job += 1;
        self.jobs.insert(
            job,
            Job {
                pid,
                exit: None,
                notify: vec![id],
                bound_to: bound.then_some(id),
            },
        );
        AgentReply::Started {
            job,
            pid: pid.as_raw(),
        }
    }

    /// Collects every exited child: jobs are recorded and their watchers told;
    /// orphans re-parented to init are just reaped.
    fn reap(&mut self) {
        loop {
            let (pid, exit) = match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) => (
                    pid,
                    JobExit {
                        code: Some(code),
                        signal: None,
                    },
                ),
                Ok(WaitStatus::Signaled(pid, sig, _)) => (
                    pid,
                    JobExit {
                        code: None,
                        signal: Some(sig as i32),
                    },
                ),
                Ok(WaitStatus::StillAlive) | Err(_) => return,
                Ok(_) => continue,
            };
            if self.copier_ended(pid, exit) {
                continue;
            }
            let Some((&job, _)) = self
                .jobs
                .iter()
                .find(|(_, j)| j.pid == pid && j.exit.is_none())
            else {
                continue;
            };
            let notify = match self.jobs.get_mut(&job) {
                Some(state) => {
                    state.exit = Some(exit);
                    std::mem::take(&mut state.notify)
                }
                None => continue,
            };
            for connection in notify {
                self.reply(connection, &AgentReply::Exited { job, exit });
            }
            self.finished.push_back(job);
            while self.finished.len() > KEEP_FINISHED {
                if let Some(old) = self.finished.pop_front() {
                    self.jobs.remove(&old);
                }
            }
        }
    }
}

fn unknown_job(job: u64) -> AgentReply {
    AgentReply::Error {
        message: format!("no job {job} in this session"),
    }
}

/// Why the job's process could not exec, written by the child into memory it shares
/// with init (CLONE_VM) before it exits.
#[derive(Default, Clone, Copy)]
struct SpawnFailure {
    /// 0: none; 1: stdio; 2: cwd; 3: exec.
    stage: u8,
    errno: i32,
    /// An exec candidate was found but not executable.
    denied: bool,
}

impl SpawnFailure {
    fn reply(self, argv0: &str, cwd: &str) -> AgentReply {
        let errno = nix::errno::Errno::from_raw(self.errno);
        let (message, exit_code) = match self.stage {
            1 => (format!("cannot set up stdio: {}", errno.desc()), 126),
            2 => (format!("working directory {cwd}: {}", errno.desc()), 126),
            _ if self.errno != libc::ENOENT && self.errno != 0 => {
                (format!("cannot execute {argv0}: {}", errno.desc()), 126)
            }
            _ if self.denied => (format!("cannot execute {argv0}: permission denied"), 126),
            _ => (format!("command not found: {argv0}"), 127),
        };
        AgentReply::ExecFailed { message, exit_code }
    }
}

struct Spawn<'a> {
    argv: &'a [CString],
    envp: &'a [CString],
    cwd: &'a CString,
    candidates: &'a [CString],
    stdio: [RawFd; 3],
    failure: SpawnFailure,
}

/// Starts a job: a vfork-style clone (init's memory is shared, nothing is copied,
/// init is suspended until the child execs or exits), which makes itself a session
/// and process-group leader, takes its stdio, enters `cwd` and execs.
fn spawn_job(mut spawn: Spawn<'_>) -> io::Result<(Pid, Option<SpawnFailure>)> {
    let mut stack = vec![0u8; 64 << 10];
    let spawn_ptr: *mut Spawn<'_> = &mut spawn;
    let start = Box::new(move || -> isize {
        // SAFETY: init is suspended (CLONE_VFORK) while this runs, so this is the only
        // access to `spawn` until the child execs or exits.
        let spawn = unsafe { &mut *spawn_ptr };
        job_child(spawn)
    });
    // SAFETY: init is single-threaded and suspended until the child execs or exits;
    // the child only calls async-signal-safe functions (no allocation), writes its
    // failure into `spawn`, and uses `stack`, which outlives the call.
    let pid = unsafe {
        nix::sched::clone(
            start,
            &mut stack,
            nix::sched::CloneFlags::CLONE_VM | nix::sched::CloneFlags::CLONE_VFORK,
            Some(libc::SIGCHLD),
        )
    }?;
    let failure = spawn.failure;
    Ok((pid, (failure.stage != 0).then_some(failure)))
}

/// In the job's process (sharing init's memory until exec): no allocation here.
fn job_child(spawn: &mut Spawn<'_>) -> isize {
    let fail = |spawn: &mut Spawn<'_>, stage: u8, errno: nix::errno::Errno| -> isize {
        spawn.failure.stage = stage;
        spawn.failure.errno = errno as i32;
        sys::exit_now(127)
    };
    let _ = nix::unistd::setsid();
    for (target, fd) in spawn.stdio.into_iter().enumerate() {
        // dup2 onto 0..2 clears close-on-exec; the originals (above 2) keep it.
        if let Err(e) = nix::unistd::dup2(fd, target as RawFd) {
            return fail(spawn, 1, e);
        }
    }
    if let Err(e) = nix::unistd::chdir(spawn.cwd.as_c_str()) {
        return fail(spawn, 2, e);
    }
    let _ = nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None);
    // SAFETY: restoring the default disposition of SIGPIPE has no memory-safety effect.
    unsafe {
        let _ = nix::sys::signal::signal(Signal::SIGPIPE, nix::sys::signal::SigHandler::SigDfl);
    }
    let mut last = nix::errno::Errno::ENOENT;
    for candidate in spawn.candidates {
        let err = nix::unistd::execve(candidate, spawn.argv, spawn.envp).unwrap_err();
        match err {
            nix::errno::Errno::EACCES => spawn.failure.denied = true,
            nix::errno::Errno::ENOENT | nix::errno::Errno::ENOTDIR => {}
            other => {
                last = other;
                break;
            }
        }
    }
    fail(spawn, 3, last)
}
