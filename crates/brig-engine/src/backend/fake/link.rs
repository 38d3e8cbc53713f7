//! The fake's side of a connection to its sandbox's init: the agent protocol's
//! requests answered in process, and the interpreter its execs run.

use std::io::{self, Write};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use brig_jail::agent::{AgentReply, AgentRequest, JobExit};
use tokio::sync::{mpsc, watch};

use super::{Job, State};
use crate::backend::{BoxFuture, Link};

/// A connection to a fake sandbox: replies queue up until read.
pub(super) struct FakeLink {
    state: Arc<State>,
    replies: mpsc::UnboundedSender<AgentReply>,
    inbox: mpsc::UnboundedReceiver<AgentReply>,
    /// Jobs killed when the connection closes (`bound` execs).
    bound: std::sync::Mutex<Vec<u64>>,
}

impl Drop for FakeLink {
    fn drop(&mut self) {
        let bound = self.bound.get_mut().unwrap_or_else(|e| e.into_inner());
        for job in bound.iter() {
            self.state.signal(*job, libc::SIGKILL);
        }
    }
}

impl Link for FakeLink {
    fn send<'a>(
        &'a self,
        request: &'a AgentRequest,
        fds: &'a [BorrowedFd<'a>],
    ) -> BoxFuture<'a, io::Result<()>> {
        let sent = self.handle(request, fds);
        Box::pin(async move { sent })
    }

    fn recv(&mut self) -> BoxFuture<'_, io::Result<(AgentReply, Vec<OwnedFd>)>> {
        Box::pin(async move {
            let mut ended = self.state.ended.subscribe();
            tokio::select! {
                biased;
                Some(reply) = self.inbox.recv() => Ok((reply, Vec::new())),
                _ = ended.wait_for(|e| *e) => Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "fake: the sandbox has ended",
                )),
            }
        })
    }
}

impl FakeLink {
    pub(super) fn new(state: Arc<State>) -> FakeLink {
        let (replies, inbox) = mpsc::unbounded_channel();
        FakeLink {
            state,
            replies,
            inbox,
            bound: Default::default(),
        }
    }

    fn handle(&self, request: &AgentRequest, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
        if !self.state.alive.load(Ordering::SeqCst) {
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, "fake: ended"));
        }
        let reply = match request {
            AgentRequest::Exec {
                argv, cwd, bound, ..
            } => {
                let [stdin, stdout, stderr] = fds else {
                    return Err(io::Error::new(io::ErrorKind::InvalidInput, "three fds"));
                };
                let stdio = [
                    stdin.try_clone_to_owned()?,
                    stdout.try_clone_to_owned()?,
                    stderr.try_clone_to_owned()?,
                ];
                let job = self.start(argv.clone(), cwd.clone(), stdio);
                if *bound {
                    self.bound
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(job);
                }
                AgentReply::Started { job, pid: 0 }
            }
            AgentRequest::Signal { job, signal } => {
                if self.state.signal(*job, *signal) {
                    AgentReply::Done
                } else {
                    AgentReply::Error {
                        message: format!("no job {job}"),
                    }
                }
            }
            AgentRequest::Wait { job } => {
                let exit = self
                    .state
                    .jobs
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .by_id
                    .get(job)
                    .map(|j| j.exit.clone());
                match exit {
                    Some(mut exit) => {
                        let (replies, job) = (self.replies.clone(), *job);
                        tokio::spawn(async move {
                            if let Ok(done) = exit.wait_for(Option::is_some).await {
                                if let Some(exit) = *done {
                                    let _ = replies.send(AgentReply::Exited { job, exit });
                                }
                            }
                        });
                        return Ok(());
                    }
                    None => AgentReply::Error {
                        message: format!("no job {job}"),
                    },
                }
            }
            other => AgentReply::Error {
                message: format!("fake: {other:?} is not supported"),
            },
        };
        let _ = self.replies.send(reply);
        Ok(())
    }

    /// Starts `argv` as a job whose end is reported on this connection.
    fn start(&self, argv: Vec<String>, cwd: String, stdio: [OwnedFd; 3]) -> u64 {
        let (exit_tx, exit_rx) = watch::channel(None);
        let (kill_tx, kill_rx) = tokio::sync::oneshot::channel();
        let job = {
            let mut jobs = self.state.jobs.lock().unwrap_or_else(|e| e.into_inner());
            jobs.next += 1;
            let job = jobs.next;
            jobs.by_id.insert(
                job,
                Job {
                    exit: exit_rx,
                    kill: Some(kill_tx),
                },
            );
            job
        };
        let replies = self.replies.clone();
        tokio::spawn(async move {
            let exit = tokio::select! {
                code = interpret(&argv, &cwd, stdio) => JobExit { code: Some(code), signal: None },
                Ok(signal) = kill_rx => JobExit { code: None, signal: Some(signal) },
            };
            exit_tx.send_replace(Some(exit));
            let _ = replies.send(AgentReply::Exited { job, exit });
        });
        job
    }
}

/// Runs a command line of the fake's few commands; returns its exit code. Its
/// stdio closes when it returns (or is dropped, killed).
async fn interpret(argv: &[String], cwd: &str, [stdin, stdout, stderr]: [OwnedFd; 3]) -> i32 {
    let script = match argv {
        [sh, c, script, ..] if sh.ends_with("sh") && c == "-c" => script.clone(),
        _ => argv.join(" "),
    };
    let mut out = std::fs::File::from(stdout);
    let mut err = std::fs::File::from(stderr);
    let mut code = 0;
    for command in script.split(';') {
        let mut words: Vec<&str> = command.split_whitespace().collect();
        let to_err = words.last() == Some(&">&2");
        if to_err {
            words.pop();
        }
        let Some((&name, args)) = words.split_first() else {
            continue;
        };
        let sink = if to_err { &mut err } else { &mut out };
        code = match name {
            "echo" => {
                let _ = writeln!(sink, "{}", args.join(" "));
                0
            }
            "pwd" => {
                let _ = writeln!(sink, "{cwd}");
                0
            }
            "true" => 0,
            "false" => 1,
            "exit" => return args.first().and_then(|n| n.parse().ok()).unwrap_or(0),
            "sleep" => {
                let seconds: f64 = args.first().and_then(|s| s.parse().ok()).unwrap_or(0.0);
                tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
                0
            }
            "cat" => {
                let Ok(input) = stdin.try_clone() else {
                    return 1;
                };
                let Ok(mut input) = tokio::net::unix::pipe::Receiver::from_owned_fd(input) else {
                    return 1;
                };
                let mut data = Vec::new();
                let _ = tokio::io::AsyncReadExt::read_to_end(&mut input, &mut data).await;
                let _ = sink.write_all(&data);
                0
            }
            other => {
                let _ = writeln!(err, "fake: {other}: not found");
                127
            }
        };
    }
    code
}
