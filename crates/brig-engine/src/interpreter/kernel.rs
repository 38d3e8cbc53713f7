//! One kernel: `kernel.py` under python3 inside the session's sandbox, started as a
//! bound exec (init kills it when its connection closes: when the kernel is
//! dropped, or the daemon dies), its stdin and stdout pipes held here.

use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use brig_jail::agent::{AgentReply, JobExit};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::pipe;
use tokio::sync::watch;

use crate::backend::Sandbox;
use crate::sessions::exec::{kill_job, pipe, sandbox_gone, start_bound, Command, ExecRequest};
use crate::sessions::Session;
use crate::state::AppState;

/// The kernel's code, run with `python3 -c`.
const KERNEL: &str = include_str!("kernel.py");
/// How long a kernel may take to say it is ready (python3's start on a loaded host).
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// An event line longer than this is dropped (only code writing to the kernel's
/// private descriptor makes one; the kernel's own are far smaller).
const MAX_LINE: usize = 16 << 20;
/// After the kernel's exit, how long what it wrote before is still read (a process
/// it forked may hold the pipe open for ever).
const DEATH_GRACE: Duration = Duration::from_millis(300);

/// What the kernel said next.
pub(super) enum Next {
    /// One event, as the kernel wrote it.
    Event(serde_json::Value),
    /// A line that is no event (python3's own complaints before the kernel ran).
    Junk(String),
    /// The kernel has exited, and all it wrote was read: how, for a human.
    Ended(String),
}

pub(super) struct Kernel {
    sandbox: Arc<dyn Sandbox>,
    job: u64,
    stdin: pipe::Sender,
    events: BufReader<pipe::Receiver>,
    /// A line read in part (reads are cancelled by timeouts: nothing may be lost).
    line: Vec<u8>,
    skipping: bool,
    /// `Some` once init reported the exit (`None` inside: the sandbox went away).
    ended: watch::Receiver<Option<Option<JobExit>>>,
    dying_until: Option<tokio::time::Instant>,
    watcher: tokio::task::AbortHandle,
    oom_before: u64,
    _permit: crate::auth::Permit,
}

impl Drop for Kernel {
    fn drop(&mut self) {
        // Closing init's connection kills a bound job; the kill is for an init that
        // predates binding.
        self.watcher.abort();
        let (sandbox, job) = (self.sandbox.clone(), self.job);
        if self.ended.borrow().is_none() {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move { kill_job(&*sandbox, job).await });
            }
        }
    }
}

impl Kernel {
    /// Starts a kernel in `session` with `cwd` (absolute) and waits until it is
    /// ready; the error says why it could not start, for a human.
    pub(super) async fn start(
        state: &AppState,
        session: &Session,
        cwd: &str,
    ) -> Result<Kernel, crate::fault::Error> {
        let env = [("MPLBACKEND", "Agg"), ("PYTHONUNBUFFERED", "1")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let request = ExecRequest {
            argv: Some(vec![
                "python3".into(),
                "-u".into(),
                "-c".into(),
                KERNEL.into(),
            ]),
            cwd: Some(cwd.to_string()),
            env: Some(env),
            ..Default::default()
        };
        let command = Command::from_request(state, session, &request)?;
        let permit = state.auth.process_permit(&session.tenant)?;
        let sandbox = session.sandbox();
        let oom_before = sandbox.oom_kills().unwrap_or(0);
        let (stdin_r, stdin_w) = pipe()?;
        let (out_r, out_w) = pipe()?;
        let mut agent = sandbox.connect().map_err(sandbox_gone)?;
        // stderr too: python3's complaints before the kernel runs come as junk lines.
        let stdio = [stdin_r.as_fd(), out_w.as_fd(), out_w.as_fd()];
        let starting = start_bound(&mut *agent, command.argv, command.env, command.cwd, &stdio);
        let reply = tokio::time::timeout(crate::backend::ANSWER_TIMEOUT, starting)
            .await
            .map_err(|_| {
                crate::sessions::exec::init_not_answering(crate::backend::ANSWER_TIMEOUT)
            })??;
        drop((stdin_r, out_w));
        let job = match reply {
            AgentReply::Started { job, .. } => job,
            AgentReply::ExecFailed { message, .. } => {
                return Err(crate::fault::Error::invalid(format!(
                    "cannot start python3 in session {}: {message}",
                    session.id
                )))
            }
            AgentReply::Error { message } => return Err(crate::fault::Error::invalid(message)),
            other => {
                return Err(crate::fault::Error::internal(format!(
                    "unexpected agent reply {other:?}"
                )))
            }
        };
        let (tx, ended) = watch::channel(None);
        let watcher = tokio::spawn(async move {
            let exit = loop {
                match agent.recv().await {
                    Ok((AgentReply::Exited { exit, .. }, _)) => break Some(exit),
                    Ok(_) => continue,
                    Err(_) => break None,
                }
            };
            let _ = tx.send(Some(exit));
            // Held until aborted: a closed connection kills nothing more, but the
            // task's end is the kernel's drop either way.
            std::future::pending::<()>().await;
            drop(agent);
        })
        .abort_handle();
        let mut kernel = Kernel {
            sandbox,
            job,
            stdin: pipe::Sender::from_owned_fd(stdin_w).map_err(crate::fault::Error::internal)?,
            events: BufReader::new(
                pipe::Receiver::from_owned_fd(out_r).map_err(crate::fault::Error::internal)?,
            ),
            line: Vec::new(),
            skipping: false,
            ended,
            dying_until: None,
            watcher,
            oom_before,
            _permit: permit,
        };
        kernel.wait_ready().await?;
        Ok(kernel)
    }

    async fn wait_ready(&mut self) -> Result<(), crate::fault::Error> {
        let mut said = String::new();
        let waited = tokio::time::timeout(READY_TIMEOUT, async {
            loop {
                match self.next().await {
                    Next::Event(event) if event["type"] == "ready" => return Ok(()),
                    Next::Event(_) => {}
                    Next::Junk(line) => {
                        said.push_str(&line);
                        said.push('\n');
                    }
                    Next::Ended(how) => return Err(how),
                }
            }
        })
        .await;
        let failed = match waited {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(how)) => how,
            Err(_) => format!("it did not start within {} s", READY_TIMEOUT.as_secs()),
        };
        let said = crate::audit::bounded(said.trim(), 2000).into_owned();
        Err(crate::fault::Error::invalid(format!(
            "the interpreter could not start: {failed}{}",
            if said.is_empty() {
                String::new()
            } else {
                format!(": {said}")
            }
        )))
    }

    /// Of the sandbox the session runs now (a restore replaces it).
    pub(super) fn in_sandbox(&self, sandbox: &Arc<dyn Sandbox>) -> bool {
        std::ptr::addr_eq(Arc::as_ptr(&self.sandbox), Arc::as_ptr(sandbox))
    }

    pub(super) fn job(&self) -> (Arc<dyn Sandbox>, u64) {
        (self.sandbox.clone(), self.job)
    }

    /// How it ended, if it has.
    pub(super) fn has_ended(&self) -> Option<String> {
        let ended = *self.ended.borrow();
        ended.map(|exit| self.describe(exit))
    }

    fn describe(&self, exit: Option<JobExit>) -> String {
        match exit {
            None => "the sandbox went away under it".into(),
            Some(JobExit {
                signal: Some(libc::SIGKILL),
                ..
            }) if self.sandbox.oom_kills().unwrap_or(0) > self.oom_before => {
                "it was killed by the OOM killer (the session's memory limit)".into()
            }
            Some(JobExit {
                signal: Some(signal),
                ..
            }) => format!("it was killed by signal {signal}"),
            Some(JobExit { code, .. }) => {
                format!("it exited with code {}", code.unwrap_or(-1))
            }
        }
    }

    /// Asks the kernel to run `code` as cell `n`.
    pub(super) async fn send(
        &mut self,
        code: &str,
        env: &std::collections::BTreeMap<String, String>,
        n: u64,
    ) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(&serde_json::json!({"code": code, "n": n, "env": env}))?;
        line.push(b'\n');
        self.stdin.write_all(&line).await
    }

    /// Interrupts the running code (SIGINT to the kernel's process group).
    pub(super) async fn interrupt(&self) {
        signal(&*self.sandbox, self.job, libc::SIGINT).await;
    }

    pub(super) async fn kill(&self) {
        kill_job(&*self.sandbox, self.job).await;
    }

    /// The kernel's next line, or its end. Cancel safe.
    pub(super) async fn next(&mut self) -> Next {
        loop {
            if let Some(until) = self.dying_until {
                return match tokio::time::timeout_at(until, self.next_line()).await {
                    Ok(Ok(Some(line))) => classify(line),
                    _ => Next::Ended(self.has_ended().unwrap_or_default()),
                };
            }
            let ended = self.ended.clone();
            tokio::select! {
                line = self.next_line() => match line {
                    Ok(Some(line)) => return classify(line),
                    // Its output closed: it has ended, or is about to be reported so.
                    _ => {
                        let ended = self.ended.clone();
                        let _ = tokio::time::timeout(
                            crate::backend::ANSWER_TIMEOUT,
                            wait_ended(ended),
                        )
                        .await;
                        return Next::Ended(self.has_ended().unwrap_or_else(|| {
                            "it closed its output".into()
                        }));
                    }
                },
                _ = wait_ended(ended) => {
                    self.dying_until = Some(tokio::time::Instant::now() + DEATH_GRACE);
                }
            }
        }
    }

    /// One line (without its newline), `None` at the end. Cancel safe: what was
    /// read stays in `self.line`.
    async fn next_line(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        loop {
            let chunk = self.events.fill_buf().await?;
            if chunk.is_empty() {
                return Ok(None);
            }
            if let Some(at) = chunk.iter().position(|&b| b == b'\n') {
                if !self.skipping {
                    self.line.extend_from_slice(&chunk[..at]);
                }
                self.events.consume(at + 1);
                let line = std::mem::take(&mut self.line);
                if std::mem::take(&mut self.skipping) {
                    return Ok(Some(b"brig: an event over 16 MiB was dropped".to_vec()));
                }
                return Ok(Some(line));
            }
            let n = chunk.len();
            if !self.skipping {
                self.line.extend_from_slice(chunk);
                if self.line.len() > MAX_LINE {
                    self.line = Vec::new();
                    self.skipping = true;
                }
            }
            self.events.consume(n);
        }
    }
}

async fn wait_ended(mut ended: watch::Receiver<Option<Option<JobExit>>>) {
    let _ = ended.wait_for(Option::is_some).await;
}

fn classify(line: Vec<u8>) -> Next {
    match serde_json::from_slice::<serde_json::Value>(&line) {
        Ok(event) if event.get("type").is_some_and(|t| t.is_string()) => Next::Event(event),
        _ => Next::Junk(String::from_utf8_lossy(&line).into_owned()),
    }
}

/// Sends `signal` to a job's process group, over a connection of its own.
pub(super) async fn signal(sandbox: &dyn Sandbox, job: u64, signal: i32) {
    if let Ok(mut agent) = sandbox.connect() {
        let _ = agent
            .call(&brig_jail::agent::AgentRequest::Signal { job, signal })
            .await;
    }
}
