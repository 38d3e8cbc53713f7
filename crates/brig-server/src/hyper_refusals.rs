//! The requests hyper refuses itself, answered with the API's JSON error.
//!
//! hyper answers a request head it cannot parse before the router sees anything:
//! 400 (a malformed request line or header), 414 (a target over 65,534 bytes, a
//! limit hyper has no setting for) and 431 (more than 100 header fields, or a head
//! over hyper's read buffer, ~408 KiB). Its answer is a bare head with
//! `content-length: 0`, and no hook changes it. So the connection's writer does:
//! [`Shaped`] replaces exactly that head with the same status carrying
//! `{"error": {"code", "message"}}`.
//!
//! Only what hyper writes on its own is replaced. [`Phase`] follows the service:
//! from the moment it is called until its response body is dropped and the bytes
//! hyper still held of it are flushed, every write is the daemon's response and
//! passes untouched, whatever bytes a tenant's download holds. hyper writes its
//! refusal only between responses (its writer idle), and then closes the
//! connection. One case keeps hyper's bare head: a refused head pipelined behind a
//! response whose last bytes were not flushed yet (both go out in one write).

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use axum::body::{Body, Bytes, HttpBody};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::fault::ErrorCode;

const IDLE: u8 = 0;
const ANSWERING: u8 = 1;
/// The response body is gone; hyper may still hold its last bytes.
const ENDING: u8 = 2;

/// Where a connection is: between responses, or writing one of the service's.
#[derive(Clone, Default)]
pub struct Phase(Arc<AtomicU8>);

impl Phase {
    /// The service was called: what is written next is its response.
    pub fn answering(&self) {
        self.0.store(ANSWERING, Ordering::SeqCst);
    }

    fn ended(&self) {
        let _ = self
            .0
            .compare_exchange(ANSWERING, ENDING, Ordering::SeqCst, Ordering::SeqCst);
    }

    fn flushed(&self) {
        let _ = self
            .0
            .compare_exchange(ENDING, IDLE, Ordering::SeqCst, Ordering::SeqCst);
    }

    fn idle(&self) -> bool {
        self.0.load(Ordering::SeqCst) == IDLE
    }
}

/// A response body of the service, which tells the connection's [`Phase`] when
/// hyper lets go of it (it has all of it then).
pub struct Answered {
    inner: Body,
    phase: Phase,
}

impl Answered {
    pub fn new(inner: Body, phase: Phase) -> Answered {
        Answered { inner, phase }
    }
}

impl Drop for Answered {
    fn drop(&mut self) {
        self.phase.ended();
    }
}

impl HttpBody for Answered {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A connection whose writes of hyper's own refusals are replaced by JSON ones.
pub struct Shaped<S> {
    inner: S,
    phase: Phase,
    /// The replacement, still to be written, and how much of it was.
    pending: Vec<u8>,
    sent: usize,
}

impl<S> Shaped<S> {
    pub fn new(inner: S, phase: Phase) -> Shaped<S> {
        Shaped {
            inner,
            phase,
            pending: Vec::new(),
            sent: 0,
        }
    }
}

impl<S: AsyncWrite + Unpin> Shaped<S> {
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.pending.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.pending[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.pending = Vec::new();
        self.sent = 0;
        Poll::Ready(Ok(()))
    }

    /// Takes `buf` as written if it is hyper's refusal: its replacement goes
    /// out instead.
    fn replaced(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Option<Poll<io::Result<usize>>> {
        if !self.phase.idle() {
            return None;
        }
        self.pending = shaped(buf)?;
        self.sent = 0;
        // What is left is written by the next write, flush or shutdown.
        if let Poll::Ready(Err(e)) = self.drain(cx) {
            return Some(Poll::Ready(Err(e)));
        }
        Some(Poll::Ready(Ok(buf.len())))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Shaped<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Shaped<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.drain(cx))?;
        if let Some(done) = this.replaced(cx, buf) {
            return done;
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.drain(cx))?;
        if let Some(first) = bufs.iter().find(|b| !b.is_empty()) {
            if let Some(done) = this.replaced(cx, first) {
                return done;
            }
        }
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.drain(cx))?;
        let flushed = ready!(Pin::new(&mut this.inner).poll_flush(cx));
        if flushed.is_ok() {
            this.phase.flushed();
        }
        Poll::Ready(flushed)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.drain(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

/// The JSON answer for `written`, if it is one of hyper's refusals: a whole head,
/// status 400, 414 or 431, with no header but `content-length: 0`, `connection`
/// and `date` (every response of the daemon's has a `content-type`, or a body).
fn shaped(written: &[u8]) -> Option<Vec<u8>> {
    let head = std::str::from_utf8(written.strip_suffix(b"\r\n\r\n")?).ok()?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next()?;
    let (code, message) = match status_line.get(..13)? {
        "HTTP/1.1 400 " => (
            ErrorCode::BadRequest,
            "the request is not valid HTTP/1.1 (a malformed request line or header)",
        ),
        "HTTP/1.1 414 " => (
            ErrorCode::UriTooLong,
            "the request target is over 65,534 bytes, the most the daemon reads",
        ),
        "HTTP/1.1 431 " => (
            ErrorCode::HeadersTooLarge,
            "the request's head is over the daemon's limits (100 header fields, 408 KiB)",
        ),
        _ => return None,
    };
    let mut empty = false;
    let mut date = None;
    for line in lines {
        let (name, value) = line.split_once(':')?;
        match name.to_ascii_lowercase().as_str() {
            "content-length" if value.trim() == "0" => empty = true,
            "date" => date = Some(value.trim()),
            "connection" => {}
            _ => return None,
        }
    }
    if !empty {
        return None;
    }
    let body =
        serde_json::json!({"error": {"code": code.as_str(), "message": message}}).to_string();
    let date = date.map(|d| format!("date: {d}\r\n")).unwrap_or_default();
    Some(
        format!(
            "{status_line}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
             connection: close\r\n{date}\r\n{body}",
            body.len()
        )
        .into_bytes(),
    )
}

#[cfg(test)]
mod tests {
    use super::shaped;

    #[test]
    fn only_hypers_bare_refusals_are_shaped() {
        let refusal = b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\n\
            content-length: 0\r\ndate: Sun, 29 Nov 2026 05:09:02 GMT\r\n\r\n";
        let out = String::from_utf8(shaped(refusal).unwrap()).unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 431 "), "{head}");
        assert!(head.contains("content-type: application/json"), "{head}");
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let value: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(value["error"]["code"], "headers_too_large");
        for other in [
            &b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 0\r\n\r\n"[..],
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 5\r\n\r\n",
            b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\nbody",
        ] {
            assert!(shaped(other).is_none(), "{}", String::from_utf8_lossy(other));
        }
    }
}
