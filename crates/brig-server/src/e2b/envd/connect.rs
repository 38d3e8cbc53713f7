//! The Connect protocol (connectrpc.com/docs/protocol), JSON codec only, as envd
//! speaks it over HTTP/1.1: unary calls (`application/json` bodies, errors as
//! `{"code": "not_found", "message"}` with the code's HTTP status) and streams
//! (`application/connect+json`: envelopes of one flag byte and a 4-byte
//! big-endian length; the last one, flag 0x02, carries `{}` or `{"error": ...}`).
//!
//! Bad input (a wrong content type, a cut or oversize envelope, a compressed one
//! nobody negotiated, JSON that is not the message) is answered with a Connect
//! error, as connect-go answers it; nothing here panics or waits on a client
//! without a bound.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Request};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::de::DeserializeOwned;
use serde::Serialize;

use brig_engine::fault::{Error as ApiError, ErrorCode};
use brig_engine::state::AppState;

pub const UNARY_JSON: &str = "application/json";
pub const STREAM_JSON: &str = "application/connect+json";
/// Envelope flags.
pub const FLAG_COMPRESSED: u8 = 0x01;
pub const FLAG_END_STREAM: u8 = 0x02;
/// The most one message (unary body or envelope) may hold; envd's own messages
/// are small, stdin chunks the largest.
pub const MAX_MESSAGE: usize = 8 << 20;
/// How long a client may take to send one message of a request.
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// Connect's error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Canceled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
}

impl Code {
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::Unknown => "unknown",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Aborted => "aborted",
            Code::OutOfRange => "out_of_range",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::DataLoss => "data_loss",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// The HTTP status of a unary error (the protocol's table).
    pub fn status(self) -> StatusCode {
        let code = match self {
            Code::Canceled => 499,
            Code::Unknown | Code::Internal | Code::DataLoss => 500,
            Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => 400,
            Code::DeadlineExceeded => 504,
            Code::NotFound => 404,
            Code::AlreadyExists | Code::Aborted => 409,
            Code::PermissionDenied => 403,
            Code::ResourceExhausted => 429,
            Code::Unimplemented => 501,
            Code::Unavailable => 503,
            Code::Unauthenticated => 401,
        };
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    /// brig's code for the refusal audit and metrics when no engine error says
    /// more.
    fn brig(self) -> ErrorCode {
        match self {
            Code::InvalidArgument | Code::OutOfRange => ErrorCode::Invalid,
            Code::FailedPrecondition | Code::Aborted => ErrorCode::Conflict,
            Code::NotFound => ErrorCode::NotFound,
            Code::AlreadyExists => ErrorCode::AlreadyExists,
            Code::PermissionDenied => ErrorCode::PermissionDenied,
            Code::ResourceExhausted => ErrorCode::PayloadTooLarge,
            Code::DeadlineExceeded | Code::Canceled => ErrorCode::RequestTimeout,
            Code::Unimplemented => ErrorCode::MethodNotAllowed,
            Code::Unavailable => ErrorCode::Unavailable,
            Code::Unauthenticated => ErrorCode::Unauthorized,
            Code::Unknown | Code::Internal | Code::DataLoss => ErrorCode::Internal,
        }
    }
}

/// A Connect error, with brig's own code for the audit.
#[derive(Debug, Clone)]
pub struct ConnectError {
    pub code: Code,
    pub message: String,
    pub brig: ErrorCode,
}

impl ConnectError {
    pub fn new(code: Code, message: impl Into<String>) -> ConnectError {
        ConnectError {
            code,
            message: message.into(),
            brig: code.brig(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> ConnectError {
        ConnectError::new(Code::InvalidArgument, message)
    }

    pub fn not_found(message: impl Into<String>) -> ConnectError {
        ConnectError::new(Code::NotFound, message)
    }

    pub fn unimplemented(message: impl Into<String>) -> ConnectError {
        ConnectError::new(Code::Unimplemented, message)
    }

    /// `{"code": "...", "message": "..."}`.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({"code": self.code.as_str(), "message": self.message})
    }
}

/// An engine error as envd would have answered it.
impl From<ApiError> for ConnectError {
    fn from(e: ApiError) -> ConnectError {
        let code = match e.code {
            ErrorCode::NotFound | ErrorCode::NoSuchFile | ErrorCode::Gone => Code::NotFound,
            ErrorCode::BadRequest
            | ErrorCode::Invalid
            | ErrorCode::InvalidPath
            | ErrorCode::InvalidArchive
            | ErrorCode::NotADirectory
            | ErrorCode::NotAFile
            | ErrorCode::UriTooLong
            | ErrorCode::HeadersTooLarge => Code::InvalidArgument,
            ErrorCode::Unauthorized => Code::Unauthenticated,
            ErrorCode::Forbidden | ErrorCode::PermissionDenied | ErrorCode::PathEscapes => {
                Code::PermissionDenied
            }
            ErrorCode::AlreadyExists => Code::AlreadyExists,
            ErrorCode::Conflict | ErrorCode::Busy | ErrorCode::NotEmpty | ErrorCode::ReadOnly => {
                Code::FailedPrecondition
            }
            ErrorCode::MethodNotAllowed => Code::Unimplemented,
            ErrorCode::RequestTimeout => Code::DeadlineExceeded,
            ErrorCode::PayloadTooLarge
            | ErrorCode::Quota
            | ErrorCode::NoSpace
            | ErrorCode::MemoryFull => Code::ResourceExhausted,
            ErrorCode::Unavailable => Code::Unavailable,
            ErrorCode::Internal => Code::Internal,
        };
        ConnectError {
            code,
            message: e.message,
            brig: e.code,
        }
    }
}

/// A unary error: the code's status, a JSON body.
impl IntoResponse for ConnectError {
    fn into_response(self) -> Response {
        let mut response = (
            self.code.status(),
            [(header::CONTENT_TYPE, HeaderValue::from_static(UNARY_JSON))],
            self.body().to_string(),
        )
            .into_response();
        response.extensions_mut().insert(self.brig);
        response
    }
}

/// One envelope.
pub fn envelope(flags: u8, payload: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(5 + payload.len());
    out.push(flags);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    Bytes::from(out)
}

/// The end of a stream: `{}`, or the error that ended it.
pub fn end_stream(error: Option<&ConnectError>) -> Bytes {
    let body = match error {
        Some(e) => serde_json::json!({"error": e.body()}),
        None => serde_json::json!({}),
    };
    envelope(FLAG_END_STREAM, body.to_string().as_bytes())
}

/// An envelope read from a buffer: its flags, payload, and the bytes it took.
#[derive(Debug, PartialEq, Eq)]
pub struct Envelope<'a> {
    pub flags: u8,
    pub payload: &'a [u8],
    pub used: usize,
}

/// Parses the envelope at the start of `buf`; `Ok(None)` if `buf` holds only part
/// of one.
pub fn parse_envelope(buf: &[u8]) -> Result<Option<Envelope<'_>>, ConnectError> {
    if buf.len() < 5 {
        return Ok(None);
    }
    let flags = buf[0];
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if flags & FLAG_COMPRESSED != 0 {
        return Err(ConnectError::invalid(
            "protocol error: a compressed message, but no Connect-Content-Encoding was agreed",
        ));
    }
    if flags & !FLAG_COMPRESSED != 0 {
        return Err(ConnectError::invalid(format!(
            "protocol error: invalid envelope flags {flags:#04x} in a request"
        )));
    }
    if len > MAX_MESSAGE {
        return Err(ConnectError::new(
            Code::ResourceExhausted,
            format!("message of {len} bytes is over the limit of {MAX_MESSAGE} bytes"),
        ));
    }
    if buf.len() < 5 + len {
        return Ok(None);
    }
    Ok(Some(Envelope {
        flags,
        payload: &buf[5..5 + len],
        used: 5 + len,
    }))
}

/// Decodes one message of the JSON codec.
pub fn decode<T: DeserializeOwned>(payload: &[u8]) -> Result<T, ConnectError> {
    // Protobuf's JSON takes an empty body as the empty message.
    let payload: &[u8] = if payload.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        payload
    };
    serde_json::from_slice(payload)
        .map_err(|e| ConnectError::invalid(format!("unmarshal message: {e}")))
}

fn media_type(headers: &HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or_default()
                .trim()
                .to_ascii_lowercase()
        })
        .unwrap_or_default()
}

/// A request the protocol refuses before any message: not a POST (405), or a
/// content type this procedure does not speak (415, what connect-go answers).
fn check_request(request: &Request, want: &'static str) -> Result<(), Box<Response>> {
    if request.method() != Method::POST {
        let mut response =
            ConnectError::unimplemented(format!("method {} is not POST", request.method()))
                .into_response();
        *response.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
        response
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("POST"));
        return Err(Box::new(response));
    }
    let got = media_type(request.headers());
    if got != want {
        let mut response = ConnectError::invalid(format!(
            "unsupported content type {got:?}: this procedure takes {want}"
        ))
        .into_response();
        *response.status_mut() = StatusCode::UNSUPPORTED_MEDIA_TYPE;
        response
            .headers_mut()
            .insert("accept-post", HeaderValue::from_static(want));
        return Err(Box::new(response));
    }
    Ok(())
}

/// The deadline the client gave (`Connect-Timeout-Ms`), if any.
pub fn timeout(headers: &HeaderMap) -> Result<Option<Duration>, ConnectError> {
    let Some(value) = headers.get("connect-timeout-ms") else {
        return Ok(None);
    };
    value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|ms| *ms > 0 && ms.to_string().len() <= 10)
        .map(|ms| Some(Duration::from_millis(ms)))
        .ok_or_else(|| ConnectError::invalid("protocol error: invalid Connect-Timeout-Ms"))
}

/// Reads a whole body of at most `limit` bytes, each chunk within [`READ_TIMEOUT`].
async fn read_body(body: Body, limit: usize) -> Result<Vec<u8>, ConnectError> {
    let mut stream = body.into_data_stream();
    let mut out = Vec::new();
    loop {
        let chunk = tokio::time::timeout(READ_TIMEOUT, stream.next())
            .await
            .map_err(|_| ConnectError::new(Code::DeadlineExceeded, "the request body stalled"))?;
        match chunk {
            None => return Ok(out),
            Some(Ok(chunk)) => {
                if out.len() + chunk.len() > limit {
                    return Err(ConnectError::new(
                        Code::ResourceExhausted,
                        format!("message is over the limit of {limit} bytes"),
                    ));
                }
                out.extend_from_slice(&chunk);
            }
            Some(Err(e)) => {
                return Err(ConnectError::invalid(format!(
                    "reading the request body: {e}"
                )))
            }
        }
    }
}

/// The message of a unary call (`application/json`).
pub struct Unary<T> {
    pub message: T,
    pub headers: HeaderMap,
}

impl<T: DeserializeOwned> FromRequest<AppState> for Unary<T> {
    type Rejection = Response;

    async fn from_request(request: Request, _state: &AppState) -> Result<Self, Response> {
        check_request(&request, UNARY_JSON).map_err(|r| *r)?;
        timeout(request.headers()).map_err(IntoResponse::into_response)?;
        let (parts, body) = request.into_parts();
        let bytes = read_body(body, MAX_MESSAGE)
            .await
            .map_err(IntoResponse::into_response)?;
        let message = decode(&bytes).map_err(IntoResponse::into_response)?;
        Ok(Unary {
            message,
            headers: parts.headers,
        })
    }
}

/// A unary answer.
pub fn unary<T: Serialize>(message: &T) -> Response {
    match serde_json::to_vec(message) {
        Ok(body) => (
            [(header::CONTENT_TYPE, HeaderValue::from_static(UNARY_JSON))],
            body,
        )
            .into_response(),
        Err(e) => ConnectError::new(Code::Internal, e.to_string()).into_response(),
    }
}

/// The one message of a server-streaming call (`application/connect+json`).
pub struct Streamed<T> {
    pub message: T,
    pub headers: HeaderMap,
    pub deadline: Option<Duration>,
}

impl<T: DeserializeOwned> FromRequest<AppState> for Streamed<T> {
    type Rejection = Response;

    async fn from_request(request: Request, _state: &AppState) -> Result<Self, Response> {
        check_request(&request, STREAM_JSON).map_err(|r| *r)?;
        let deadline = timeout(request.headers()).map_err(stream_error)?;
        let (parts, body) = request.into_parts();
        let bytes = read_body(body, MAX_MESSAGE + 5)
            .await
            .map_err(stream_error)?;
        let message = match parse_envelope(&bytes).map_err(stream_error)? {
            Some(e) if e.used == bytes.len() => decode(e.payload).map_err(stream_error)?,
            Some(_) => {
                return Err(stream_error(ConnectError::invalid(
                    "protocol error: more than one message for a server-streaming call",
                )))
            }
            None => {
                return Err(stream_error(ConnectError::invalid(format!(
                    "protocol error: incomplete envelope ({} bytes)",
                    bytes.len()
                ))))
            }
        };
        Ok(Streamed {
            message,
            headers: parts.headers,
            deadline,
        })
    }
}

/// The messages of a client-streaming call, as they come.
pub struct Incoming {
    body: axum::body::BodyDataStream,
    buf: Vec<u8>,
    pub headers: HeaderMap,
}

impl FromRequest<AppState> for Incoming {
    type Rejection = Response;

    async fn from_request(request: Request, _state: &AppState) -> Result<Self, Response> {
        check_request(&request, STREAM_JSON).map_err(|r| *r)?;
        timeout(request.headers()).map_err(stream_error)?;
        let (parts, body) = request.into_parts();
        Ok(Incoming {
            body: body.into_data_stream(),
            buf: Vec::new(),
            headers: parts.headers,
        })
    }
}

impl Incoming {
    /// The next message; `None` at the end of the body (a body cut inside an
    /// envelope is an error). A client that sends nothing for `idle` is an error.
    pub async fn next<T: DeserializeOwned>(
        &mut self,
        idle: Duration,
    ) -> Result<Option<T>, ConnectError> {
        loop {
            if let Some(envelope) = parse_envelope(&self.buf)? {
                let message = decode(envelope.payload);
                let used = envelope.used;
                self.buf.drain(..used);
                return message.map(Some);
            }
            let chunk = tokio::time::timeout(idle, self.body.next())
                .await
                .map_err(|_| {
                    ConnectError::new(Code::DeadlineExceeded, "the input stream stalled")
                })?;
            match chunk {
                None if self.buf.is_empty() => return Ok(None),
                None => {
                    return Err(ConnectError::invalid(format!(
                        "protocol error: incomplete envelope ({} bytes)",
                        self.buf.len()
                    )))
                }
                Some(Ok(chunk)) => self.buf.extend_from_slice(&chunk),
                Some(Err(e)) => {
                    return Err(ConnectError::invalid(format!(
                        "reading the request body: {e}"
                    )))
                }
            }
        }
    }
}

/// A stream's answer that is only its end: the error (HTTP 200, as the protocol
/// has streams answer).
pub fn stream_error(error: ConnectError) -> Response {
    let brig = error.brig;
    let mut response = (
        [(header::CONTENT_TYPE, HeaderValue::from_static(STREAM_JSON))],
        end_stream(Some(&error)),
    )
        .into_response();
    response.extensions_mut().insert(brig);
    response
}

/// The sending side of a streamed answer; the body ends when it is dropped
/// (without an end message: a cut stream) or [`Sender::end`]ed.
pub struct Sender {
    tx: tokio::sync::mpsc::Sender<Bytes>,
}

impl Sender {
    /// Sends one message; `false` once the client has gone.
    pub async fn send<T: Serialize>(&self, message: &T) -> bool {
        let Ok(payload) = serde_json::to_vec(message) else {
            return false;
        };
        self.tx.send(envelope(0, &payload)).await.is_ok()
    }

    /// Whether the client has gone (the body was dropped).
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Ends the stream, with the error that ended it if any.
    pub async fn end(self, error: Option<ConnectError>) {
        let _ = self.tx.send(end_stream(error.as_ref())).await;
    }
}

/// A streamed answer and its sender.
pub fn stream() -> (Sender, Response) {
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(8);
    let body = Body::from_stream(
        tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok::<_, std::convert::Infallible>),
    );
    let response = (
        [(header::CONTENT_TYPE, HeaderValue::from_static(STREAM_JSON))],
        body,
    )
        .into_response();
    (Sender { tx }, response)
}

/// What the router answers for a procedure it does not have.
pub async fn unknown_procedure(request: Request) -> Response {
    let mut response = ConnectError::unimplemented(format!(
        "{} is not a procedure of this envd",
        request.uri().path()
    ))
    .into_response();
    *response.status_mut() = StatusCode::NOT_FOUND;
    response.extensions_mut().insert(ErrorCode::NotFound);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_round_trip_and_cut_ones_wait_for_more() {
        let frame = envelope(0, br#"{"a":1}"#);
        assert_eq!(&frame[..5], &[0, 0, 0, 0, 7]);
        let parsed = parse_envelope(&frame).unwrap().unwrap();
        assert_eq!(
            (parsed.flags, parsed.payload, parsed.used),
            (0, &br#"{"a":1}"#[..], 12)
        );
        for cut in 0..frame.len() {
            assert!(parse_envelope(&frame[..cut]).unwrap().is_none(), "{cut}");
        }
    }

    #[test]
    fn bad_flags_compression_and_oversize_are_refused() {
        let compressed = envelope(FLAG_COMPRESSED, b"{}");
        assert_eq!(
            parse_envelope(&compressed).unwrap_err().code,
            Code::InvalidArgument
        );
        for flags in [FLAG_END_STREAM, 0x80, 0x04] {
            let e = parse_envelope(&envelope(flags, b"{}")).unwrap_err();
            assert_eq!(e.code, Code::InvalidArgument, "{flags}");
        }
        // Refused from its header alone: nothing that large is ever buffered.
        let mut huge = vec![0u8];
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(
            parse_envelope(&huge).unwrap_err().code,
            Code::ResourceExhausted
        );
    }

    #[test]
    fn end_stream_carries_the_error() {
        let end = end_stream(Some(&ConnectError::not_found("no such process")));
        assert_eq!(end[0], FLAG_END_STREAM);
        let body: serde_json::Value = serde_json::from_slice(&end[5..]).unwrap();
        assert_eq!(body["error"]["code"], "not_found");
        assert_eq!(&end_stream(None)[5..], b"{}");
    }

    #[test]
    fn messages_decode_as_protobuf_json_does() {
        #[derive(serde::Deserialize, Debug)]
        struct M {
            #[serde(default)]
            path: String,
        }
        assert_eq!(decode::<M>(b"").unwrap().path, "");
        assert_eq!(decode::<M>(br#"{"path":"/a","x":1}"#).unwrap().path, "/a");
        assert_eq!(
            decode::<M>(br#"{"path":"#).unwrap_err().code,
            Code::InvalidArgument
        );
    }

    #[test]
    fn codes_take_the_protocols_statuses() {
        assert_eq!(Code::NotFound.status(), 404);
        assert_eq!(Code::Unimplemented.status(), 501);
        assert_eq!(Code::ResourceExhausted.status(), 429);
        assert_eq!(Code::Canceled.status().as_u16(), 499);
        let e: ConnectError = ApiError::not_found("x").into();
        assert_eq!(e.code, Code::NotFound);
    }

    #[test]
    fn timeouts_parse_or_are_refused() {
        let mut headers = HeaderMap::new();
        assert_eq!(timeout(&headers).unwrap(), None);
        headers.insert("connect-timeout-ms", HeaderValue::from_static("1500"));
        assert_eq!(
            timeout(&headers).unwrap(),
            Some(Duration::from_millis(1500))
        );
        headers.insert("connect-timeout-ms", HeaderValue::from_static("soon"));
        assert!(timeout(&headers).is_err());
    }
}
