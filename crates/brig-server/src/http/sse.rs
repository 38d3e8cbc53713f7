//! Server-Sent Events: the one pump that turns an engine's stream of typed events
//! into an SSE response (a streamed exec, a followed process).
//!
//! The pump pulls an event only when hyper asks for the next piece of the body, so
//! a client that reads slowly holds back the engine's producer (whose queue and
//! idle timeouts decide what happens then), and a client that hangs up drops the
//! engine's stream with the response.

use std::convert::Infallible;

use axum::http::{header, HeaderValue};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::{Stream, StreamExt};
use serde::Serialize;

/// Output longer than this is escaped off the runtime's workers: it can escape to
/// six times its size, and must not hold up other requests meanwhile.
const ESCAPE_INLINE: usize = 4 << 10;

/// One event on its way out: a name and its JSON data.
pub struct Frame {
    name: &'static str,
    data: Data,
}

enum Data {
    /// Output, sent as `{"data": text}` (escaped by the pump).
    Output(String),
    /// JSON already encoded.
    Json(String),
}

impl Frame {
    /// Output text as `{"data": text}` under `name` (`stdout`, `stderr`).
    pub fn output(name: &'static str, text: String) -> Frame {
        Frame {
            name,
            data: Data::Output(text),
        }
    }

    /// `data` as JSON under `name`; `None` if it cannot be encoded (the event is
    /// left out, as it always was).
    pub fn json(name: &'static str, data: &impl Serialize) -> Option<Frame> {
        let json = serde_json::to_string(data).ok()?;
        Some(Frame {
            name,
            data: Data::Json(json),
        })
    }

    async fn into_event(self) -> Option<Event> {
        #[derive(Serialize)]
        struct Output<'a> {
            data: &'a str,
        }
        let json = match self.data {
            Data::Json(json) => json,
            Data::Output(text) if text.len() <= ESCAPE_INLINE => {
                serde_json::to_string(&Output { data: &text }).ok()?
            }
            Data::Output(text) => {
                tokio::task::spawn_blocking(move || serde_json::to_string(&Output { data: &text }))
                    .await
                    .ok()?
                    .ok()?
            }
        };
        Some(Event::default().event(self.name).data(json))
    }
}

/// The SSE response for `events`, each made a [`Frame`] by `frame` (`None`: left
/// out). An event that cannot be built ends the stream.
pub fn pump<S, F>(events: S, frame: F) -> Response
where
    S: Stream + Send + 'static,
    F: Fn(S::Item) -> Option<Frame> + Send + 'static,
{
    let events = events
        .filter_map(move |event| std::future::ready(frame(event)))
        .then(Frame::into_event)
        .take_while(|event| std::future::ready(event.is_some()))
        .filter_map(|event| std::future::ready(event.map(Ok::<_, Infallible>)));
    sse_response(events)
}

/// A Server-Sent Events response. The charset is named: the data is UTF-8 JSON, and
/// without it clients such as Python's `requests` decode `text/*` as ISO-8859-1
/// (RFC 2616's default), garbling every non-ASCII character.
fn sse_response<S>(events: S) -> Response
where
    S: Stream<Item = Result<Event, Infallible>> + Send + 'static,
{
    let mut response = Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    response
}
