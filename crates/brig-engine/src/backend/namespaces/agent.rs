//! The async side of brig-jail's agent protocol over init's socket: one connection
//! per operation to a session's init, driven by tokio's reactor.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::Path;

use brig_jail::agent::{AgentConnection, AgentReply, AgentRequest};
use tokio::io::unix::AsyncFd;

use crate::backend::{not_answering, ANSWER_TIMEOUT};

pub struct Agent {
    connection: AsyncFd<AgentConnection>,
}

impl Agent {
    pub fn connect(socket: &Path) -> io::Result<Agent> {
        let connection = AgentConnection::connect(socket, true)?;
        Ok(Agent {
            connection: register(connection)?,
        })
    }

    pub async fn send(&self, request: &AgentRequest, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
        loop {
            let mut guard = self.connection.writable().await?;
            match guard.try_io(|inner| inner.get_ref().send(request, fds)) {
                Ok(result) => return result,
                Err(_would_block) => continue,
            }
        }
    }

    /// The next reply; an error when init closed the connection (it exited).
    pub async fn recv(&mut self) -> io::Result<(AgentReply, Vec<OwnedFd>)> {
        loop {
            let mut guard = self.connection.readable_mut().await?;
            match guard.try_io(|inner| inner.get_mut().recv()) {
                Ok(Ok(Some(reply))) => return Ok(reply),
                Ok(Ok(None)) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the session's sandbox closed the connection (it has exited)",
                    ))
                }
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }

    /// One request, one reply, within [`ANSWER_TIMEOUT`].
    pub async fn call(&mut self, request: &AgentRequest) -> io::Result<(AgentReply, Vec<OwnedFd>)> {
        let answer = async {
            self.send(request, &[]).await?;
            self.recv().await
        };
        tokio::time::timeout(ANSWER_TIMEOUT, answer)
            .await
            .unwrap_or_else(|_| Err(not_answering()))
    }
}

/// Registers a descriptor owner with tokio's reactor.
///
/// `AsyncFd::new` is deprecated because an arbitrary `T` could close or swap its
/// descriptor while registered; the owners used here (`AgentConnection`, `OwnedFd`)
/// own one descriptor for their whole life and never change it, which is exactly
/// the contract of the `unsafe` replacement, so the safe call stays sound (and this
/// crate stays free of `unsafe`).
pub fn register<T: std::os::fd::AsRawFd>(owner: T) -> io::Result<AsyncFd<T>> {
    #[allow(deprecated)]
    AsyncFd::new(owner)
}

/// Connects and makes one call.
pub async fn call(socket: &Path, request: &AgentRequest) -> io::Result<(AgentReply, Vec<OwnedFd>)> {
    Agent::connect(socket)?.call(request).await
}
