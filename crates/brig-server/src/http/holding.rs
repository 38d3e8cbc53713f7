//! Answers whose body holds a permit (an exec slot, a transfer) until the client has
//! read them: a large answer read slowly counts against the caps it was admitted
//! under for as long as it is being read.

use axum::response::IntoResponse;
use serde::Serialize;

use brig_engine::auth::Permit;
use brig_engine::fault::Error;

use super::HttpError;

/// `answer` as a JSON response whose body holds `permit` until the client has
/// (nearly) all of it, or its connection is gone: a large answer a client reads
/// slowly then counts against the caps the permit counts in.
pub fn json_holding<T: Serialize>(answer: &T, permit: Permit) -> axum::response::Response {
    match serde_json::to_vec(answer) {
        Ok(json) => bytes_holding("application/json", json.into(), permit),
        Err(e) => HttpError(Error::internal(e)).into_response(),
    }
}

/// `bytes` as a response whose body holds `permit`, as [`json_holding`].
pub fn bytes_holding(
    content_type: &'static str,
    bytes: axum::body::Bytes,
    permit: Permit,
) -> axum::response::Response {
    // An answer of one piece goes to hyper's buffer whole anyway: plainly, as any.
    let body = if bytes.len() <= HOLDING_PIECE {
        axum::body::Body::from(bytes)
    } else {
        axum::body::Body::new(Holding {
            rest: bytes,
            _permit: permit,
        })
    };
    ([(axum::http::header::CONTENT_TYPE, content_type)], body).into_response()
}

/// What [`Holding`] gives hyper at a time.
const HOLDING_PIECE: usize = 64 << 10;

/// A body given to hyper a piece at a time: it takes the next piece only when it
/// has written out most of the last, so the body (and the permit it holds) lives
/// until the client has read nearly all of it. Given whole, it would be dropped at
/// once.
struct Holding {
    rest: axum::body::Bytes,
    _permit: Permit,
}

impl http_body::Body for Holding {
    type Data = axum::body::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        if self.rest.is_empty() {
            return std::task::Poll::Ready(None);
        }
        let n = self.rest.len().min(HOLDING_PIECE);
        let piece = self.rest.split_to(n);
        std::task::Poll::Ready(Some(Ok(http_body::Frame::data(piece))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.rest.len() as u64)
    }
}
