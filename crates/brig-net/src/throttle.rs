//! The per-sandbox bandwidth cap: one token bucket per direction, shared by every
//! connection of the sandbox, so opening more connections gains nothing. A read
//! that takes the bucket into debt is allowed; the next read on that stream waits
//! until the debt is paid. Only capped sandboxes go through here: the uncapped
//! path stays a plain `copy_bidirectional`.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Bytes per second, with a burst of one second's worth.
pub(crate) struct Bucket {
    rate: f64,
    state: Mutex<(f64, Instant)>,
}

impl Bucket {
    pub fn new(bytes_per_second: u64) -> Arc<Bucket> {
        let rate = bytes_per_second.max(1) as f64;
        Arc::new(Bucket {
            rate,
            state: Mutex::new((rate, Instant::now())),
        })
    }

    /// Takes `n` bytes; how long the taker waits before it reads again.
    fn take(&self, n: usize) -> Duration {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let refill = now.duration_since(state.1).as_secs_f64() * self.rate;
        state.0 = (state.0 + refill).min(self.rate) - n as f64;
        state.1 = now;
        if state.0 >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-state.0 / self.rate)
        }
    }
}

/// A stream whose reads draw on `bucket`; writes pass through.
pub(crate) struct Throttled<S> {
    inner: S,
    bucket: Arc<Bucket>,
    wait: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> Throttled<S> {
    pub fn new(inner: S, bucket: Arc<Bucket>) -> Self {
        Throttled {
            inner,
            bucket,
            wait: None,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Throttled<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if let Some(wait) = self.wait.as_mut() {
            ready!(wait.as_mut().poll(cx));
            self.wait = None;
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.inner).poll_read(cx, buf))?;
        let read = buf.filled().len() - before;
        if read > 0 {
            let pause = self.bucket.take(read);
            if !pause.is_zero() {
                self.wait = Some(Box::pin(tokio::time::sleep(pause)));
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Throttled<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_of_a_seconds_worth_is_free_and_debt_is_paid_in_time() {
        let bucket = Bucket::new(1000);
        assert_eq!(bucket.take(1000), Duration::ZERO);
        let wait = bucket.take(500);
        assert!(
            wait >= Duration::from_millis(490) && wait <= Duration::from_millis(510),
            "{wait:?}"
        );
    }

    #[tokio::test]
    async fn a_capped_copy_takes_as_long_as_the_rate_says() {
        use tokio::io::AsyncReadExt;
        tokio::time::pause();
        let data = vec![7u8; 3000];
        let mut reader = Throttled::new(&data[..], Bucket::new(1000));
        let started = tokio::time::Instant::now();
        let mut out = Vec::new();
        reader.read_to_end(&mut out).await.unwrap();
        assert_eq!(out.len(), 3000);
        // The first 1000 bytes are the burst; the other 2000 take two seconds.
        assert!(
            started.elapsed() >= Duration::from_millis(1900),
            "{:?}",
            started.elapsed()
        );
    }
}
