//! Startup, the router and its middleware, and graceful shutdown.
//!
//! Every route is registered through `utoipa_axum::routes!`, so the OpenAPI document
//! served at `/v1/openapi.json` is generated from the handlers that are actually
//! routed. Modules contribute an `OpenApiRouter<AppState>` (`routes()`), merged in
//! [`api_router`].

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use anyhow::Context;
use axum::body::HttpBody;
use axum::extract::{DefaultBodyLimit, Extension};
use axum::http::{header, HeaderValue};
use axum::middleware::{from_fn, from_fn_with_state, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde::{Deserialize, Serialize};
use tower_http::trace::{DefaultOnResponse, TraceLayer};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::Frontend;
use crate::config::{Config, LogFormat, ServeArgs};
use crate::error::{not_found_fallback, ApiJson, Error, ErrorBody, HttpError};
use crate::state::AppState;

/// How long in-flight requests may run on after SIGTERM/SIGINT.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

#[derive(OpenApi)]
#[openapi(
    info(
        title = "brig",
        description = "Sandboxes for untrusted code as a service. Errors are \
            `{\"error\": {\"code\", \"message\"}}`; see docs/API.md."
    ),
    modifiers(&SecuritySchemes),
    components(schemas(ErrorBody, crate::rest::audit::AuditFormat)),
    tags(
        (name = "operations", description = "Health, metrics, this document"),
        (name = "tenants", description = "API keys, tenants and quotas"),
        (name = "files", description = "Uploaded files (onyx-compatible)"),
        (name = "audit", description = "The audit log"),
    )
)]
pub struct ApiDoc;

/// `bearer` (`Authorization: Bearer <key>`) and `api_key` (`X-API-Key: <key>`).
struct SecuritySchemes;

impl Modify for SecuritySchemes {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        components.add_security_scheme(
            "api_key",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::new("X-API-Key"))),
        );
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// Always `ok` while the daemon answers.
    pub status: String,
    pub version: String,
    /// The default image (`--default-image`, what `/v1/execute` runs in), by name.
    pub images: std::collections::BTreeMap<String, ImageHealth>,
}

/// Where an image stands: `ready`; `missing` (with why and what to do);
/// `building` (the step under way, e.g. `step 3/7: pip install ...`, and for how
/// long); `failed` (why; not retried until the daemon restarts).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ImageHealth {
    /// `ready`, `missing`, `building` or `failed`.
    pub state: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub elapsed_seconds: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Liveness, version and the default image's state (no auth).
#[utoipa::path(
    get,
    path = "/health",
    tag = "operations",
    responses((status = 200, body = Health))
)]
async fn health(axum::extract::State(state): axum::extract::State<AppState>) -> ApiJson<Health> {
    ApiJson(Health {
        status: "ok".to_string(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        images: [default_image_health(state).await].into(),
    })
}

/// The default image's name and state, as `/health` reports it.
pub(crate) async fn default_image_health(state: AppState) -> (String, ImageHealth) {
    use brig_engine::default_image::ImageState;
    let name = state.args.default_image.clone();
    let image = tokio::task::spawn_blocking(move || brig_engine::default_image::state(&state))
        .await
        .unwrap_or_else(|e| ImageState::Failed {
            error: e.to_string(),
        });
    let none = ImageHealth {
        state: String::new(),
        step: None,
        elapsed_seconds: None,
        message: None,
        error: None,
    };
    let image = match image {
        ImageState::Ready => ImageHealth {
            state: "ready".into(),
            ..none
        },
        ImageState::Missing { message } => ImageHealth {
            state: "missing".into(),
            message: Some(message),
            ..none
        },
        ImageState::Building {
            step,
            elapsed_seconds,
        } => ImageHealth {
            state: "building".into(),
            step: Some(step),
            elapsed_seconds: Some(elapsed_seconds),
            ..none
        },
        ImageState::Failed { error } => ImageHealth {
            state: "failed".into(),
            error: Some(error),
            ..none
        },
    };
    (name, image)
}

/// The OpenAPI document, rendered once when the router is built.
#[derive(Clone)]
struct OpenApiJson(Arc<String>);

/// This API's OpenAPI document (no auth).
#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    tag = "operations",
    responses((status = 200, description = "OpenAPI 3 document", content_type = "application/json"))
)]
async fn openapi_json(Extension(doc): Extension<OpenApiJson>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        doc.0.as_str().to_owned(),
    )
        .into_response()
}

/// Every route with its OpenAPI description, before middleware.
pub fn api_router(args: &Config) -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(health))
        .routes(routes!(openapi_json))
        .merge(crate::rest::metrics::routes())
        .merge(crate::onyx::files::routes(args).layer(Extension(Frontend::Onyx)))
        .merge(crate::rest::files::routes())
        .merge(crate::rest::snapshots::routes())
        .merge(crate::rest::exec::routes())
        .merge(crate::rest::processes::routes())
        .merge(crate::rest::interpreter::routes())
        .merge(crate::rest::volumes::routes())
        .merge(crate::onyx::execute::routes().layer(Extension(Frontend::Onyx)))
        .merge(crate::onyx::bash::routes().layer(Extension(Frontend::Onyx)))
        .merge(crate::rest::sessions::routes())
        .merge(crate::rest::tenants::routes())
        .merge(crate::rest::audit::routes())
}

/// The OpenAPI document of everything [`router`] serves.
pub fn openapi(args: &Config) -> utoipa::openapi::OpenApi {
    described(api_router(args).into_openapi())
}

/// `api` with a description on every response: OpenAPI requires one, and utoipa
/// leaves it out when the annotation gives none, which makes the document invalid
/// for validators and client generators. The status's reason phrase stands in.
/// Every operation also gets a `default` response, the error body, for the statuses
/// its annotation does not list (401, 413, 429, 503, ... see docs/API.md), so that
/// generated clients parse every error the same way.
fn described(mut api: utoipa::openapi::OpenApi) -> utoipa::openapi::OpenApi {
    use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};
    let error = ResponseBuilder::new()
        .description("An error: `{\"error\": {\"code\", \"message\"}}` (codes in docs/API.md)")
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ErrorBody")))
                .build(),
        )
        .build();
    for item in api.paths.paths.values_mut() {
        let operations = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.options,
            &mut item.head,
            &mut item.patch,
            &mut item.trace,
        ];
        for operation in operations.into_iter().flatten() {
            let responses = &mut operation.responses.responses;
            responses
                .entry("default".to_string())
                .or_insert_with(|| RefOr::T(error.clone()));
            for (status, response) in responses.iter_mut() {
                if let RefOr::T(response) = response {
                    if response.description.is_empty() {
                        response.description = status
                            .parse::<u16>()
                            .ok()
                            .and_then(|code| axum::http::StatusCode::from_u16(code).ok())
                            .and_then(|code| code.canonical_reason())
                            .unwrap_or("Response")
                            .to_string();
                    }
                }
            }
        }
    }
    api
}

/// The complete HTTP service: routes, fallbacks and middleware (outermost first:
/// tracing, request metrics, `Connection: close` after unread bodies, error shaping +
/// refusal audit, under `--no-auth` the loopback-only check, JSON body limit).
pub fn router(state: AppState) -> Router {
    let (routes, api) = api_router(&state.args).split_for_parts();
    let doc = described(api).to_json().unwrap_or_else(|e| {
        tracing::error!(error = %e, "cannot render the OpenAPI document");
        "{}".to_string()
    });
    let max_body = usize::try_from(state.args.max_body_bytes).unwrap_or(usize::MAX);
    let e2b_key = crate::e2b::TokenKey::load_or_create(&state.data_dir).unwrap_or_else(|e| {
        tracing::error!(error = %format!("{e:#}"), "E2B access tokens will not outlive this run");
        crate::e2b::TokenKey::ephemeral()
    });
    let routes = routes
        .merge(crate::mcp::http::routes(&state))
        .merge(crate::e2b::control::routes().layer(Extension(Frontend::E2b)))
        .nest("/onyx", crate::onyx::mount::router(&state.args))
        .fallback(not_found_fallback)
        .method_not_allowed_fallback(crate::onyx::error::method_not_allowed)
        .layer(Extension(OpenApiJson(Arc::new(doc))))
        .layer(Extension(e2b_key.clone()))
        // Axum's buffering extractors (JSON) stop at this; routes that stream bodies
        // set their own limits (uploads: --max-file-size).
        .layer(DefaultBodyLimit::max(max_body))
        // Before any route: E2B's sandbox plane is chosen by header, not by path.
        .layer(from_fn_with_state(
            crate::e2b::Planes::new(&state, e2b_key),
            crate::e2b::sandbox_plane,
        ));
    // Inside the refusal audit, so that what it refuses is recorded; it runs before
    // any handler and the fallbacks alike, so no route (not even /health) is left out.
    let routes = if state.args.no_auth {
        routes.layer(from_fn(loopback_only))
    } else {
        routes
    };
    routes
        // Inside the refusal audit, so that a stalled body is recorded as the 408 it is.
        .layer(from_fn_with_state(state.clone(), body_deadline))
        .layer(from_fn_with_state(
            state.clone(),
            crate::http::refusals::refusals,
        ))
        .layer(from_fn(close_if_body_unread))
        .layer(from_fn(crate::http::metrics::track_requests))
        // One span and one `info` line per request (method, path, status, latency);
        // headers are not logged, so keys never reach the log.
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(request_span)
                .on_response(DefaultOnResponse::new().level(tracing::Level::INFO)),
        )
        .with_state(state)
}

/// The span of a request, in every line logged while it is served: tower-http's
/// default logs the method and the whole target, and any client without a key could
/// make each line several KiB long (see [`crate::audit::MAX_RECORDED_METHOD`]).
fn request_span<B>(request: &axum::http::Request<B>) -> tracing::Span {
    use crate::audit::{bounded, MAX_RECORDED_METHOD, MAX_RECORDED_PATH};
    let uri = request.uri().to_string();
    tracing::info_span!(
        "request",
        method = %bounded(request.method().as_str(), MAX_RECORDED_METHOD),
        uri = %bounded(&uri, MAX_RECORDED_PATH),
        version = ?request.version(),
    )
}

/// Middleware under `--no-auth`: refuses (403) a request whose `Host` is not a
/// loopback name or address, or that carries an `Origin`. With no key to ask for,
/// the only thing keeping a web page from the API is the browser's same-origin rule,
/// and DNS rebinding (a page on `evil.example` whose name is re-pointed to 127.0.0.1)
/// makes the daemon that page's own origin: its requests then say `Host:
/// evil.example`. Browsers send `Origin` on cross-origin requests and on every POST,
/// so refusing it also stops cross-site form and `no-cors` uploads, which need no
/// preflight; brig's clients, curl and scripts send none.
async fn loopback_only(request: axum::extract::Request, next: Next) -> Response {
    if request.headers().contains_key(header::ORIGIN) {
        return HttpError(Error::forbidden(
            "requests from web pages (with an Origin header) are refused under --no-auth",
        ))
        .into_response();
    }
    // HTTP/1.0 clients may send no Host; an absolute-form target names one too, and
    // hyper checks neither against the other.
    let mut hosts = request
        .headers()
        .get_all(header::HOST)
        .iter()
        .map(|value| value.to_str().ok())
        .chain(request.uri().authority().map(|a| Some(a.as_str())));
    if !hosts.all(|host| host.is_some_and(is_loopback_host)) {
        return HttpError(Error::forbidden(
            "under --no-auth only a Host of localhost, 127.0.0.0/8 or [::1] is served",
        ))
        .into_response();
    }
    next.run(request).await
}

/// Whether a `Host` value (with or without a port) is `localhost`, an address in
/// 127.0.0.0/8 or `[::1]`: names that no DNS answer can re-point elsewhere.
fn is_loopback_host(host: &str) -> bool {
    let (name, port, v6) = match host.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((name, port)) => (name, port, true),
            None => return false,
        },
        None => {
            let (name, port) = host.split_at(host.find(':').unwrap_or(host.len()));
            (name, port, false)
        }
    };
    let port_ok = port.is_empty()
        || port
            .strip_prefix(':')
            .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    port_ok
        && if v6 {
            name.parse::<std::net::Ipv6Addr>()
                .is_ok_and(|ip| ip.is_loopback())
        } else {
            name.eq_ignore_ascii_case("localhost")
                || name
                    .parse::<std::net::Ipv4Addr>()
                    .is_ok_and(|ip| ip.is_loopback())
        }
}

/// Middleware: every request body is read under `--body-timeout`, whichever handler
/// and extractor reads it (JSON, multipart, tar, stdin). A client that sends part of a
/// body and then nothing would otherwise hold its connection, and whatever the
/// handler holds while it waits (a transfer permit, a blocking thread), for as long as
/// it keeps the socket open. The handler sees a read error and fails however it fails
/// on one (400 for JSON, 500 for a tar cut short...); the client is told what
/// happened instead: 408 `request_timeout`.
async fn body_deadline(
    axum::extract::State(state): axum::extract::State<AppState>,
    request: axum::extract::Request,
    next: Next,
) -> Response {
    let idle = Duration::from_millis(state.args.body_timeout_ms);
    let stalled = Arc::new(AtomicBool::new(false));
    let (parts, body) = request.into_parts();
    let body = axum::body::Body::new(Paced {
        inner: body,
        idle,
        wait: None,
        stalled: stalled.clone(),
    });
    let response = next
        .run(axum::extract::Request::from_parts(parts, body))
        .await;
    let status = response.status();
    if stalled.load(Ordering::SeqCst) && (status.is_client_error() || status.is_server_error()) {
        return HttpError(Error::request_timeout(stalled_message(idle))).into_response();
    }
    response
}

fn stalled_message(idle: Duration) -> String {
    format!(
        "the request body stalled: the client sent nothing for {} s (--body-timeout)",
        idle.as_secs_f64()
    )
}

/// A request body that fails once the client has sent nothing for `idle` while it
/// was being read. The clock runs only while a frame is awaited: a handler busy
/// with the previous chunk (writing it into a sandbox) does not use up the client's
/// time.
struct Paced {
    inner: axum::body::Body,
    idle: Duration,
    wait: Option<Pin<Box<tokio::time::Sleep>>>,
    stalled: Arc<AtomicBool>,
}

impl HttpBody for Paced {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        if self.stalled.load(Ordering::SeqCst) {
            return Poll::Ready(Some(Err(stalled_error(self.idle))));
        }
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            self.wait = None;
            return Poll::Ready(frame);
        }
        let idle = self.idle;
        let wait = self
            .wait
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
        if std::future::Future::poll(wait.as_mut(), cx).is_pending() {
            return Poll::Pending;
        }
        self.stalled.store(true, Ordering::SeqCst);
        Poll::Ready(Some(Err(stalled_error(idle))))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// An io error of kind `TimedOut` inside: readers that turn body errors into io
/// errors (uploads) keep the kind, and answer 408 themselves.
fn stalled_error(idle: Duration) -> axum::Error {
    axum::Error::new(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        stalled_message(idle),
    ))
}

/// Middleware: the response to a request whose body was not read to its end (a
/// refusal before the body, a tar read up to its end-of-archive marker, a handler
/// that takes no body but got one) says `Connection: close`. hyper closes such a
/// connection after the response anyway unless the rest of the body happens to have
/// arrived already, and without the header a keep-alive client would send its next
/// request on a connection about to be closed and fail with "connection reset".
async fn close_if_body_unread(request: axum::extract::Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    let read = Arc::new(AtomicBool::new(body.is_end_stream()));
    let body = axum::body::Body::new(Tracked {
        inner: body,
        read: read.clone(),
    });
    let mut response = next
        .run(axum::extract::Request::from_parts(parts, body))
        .await;
    if !read.load(Ordering::SeqCst) {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// A request body that notes when it has been read to its end.
struct Tracked {
    inner: axum::body::Body,
    read: Arc<AtomicBool>,
}

impl HttpBody for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let frame = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(frame, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.read.store(true, Ordering::SeqCst);
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Logs to stderr, as text or JSON lines; `RUST_LOG` filters (default `info`). A
/// second call (or a subscriber set by an embedding program) is ignored.
pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

// The engine's start-up and background work: any front end (this server, an
// in-process MCP server) starts the engine the same way.
pub use brig_engine::boot::{spawn_background, start};

/// `brig serve`: runs the daemon until SIGTERM or SIGINT.
pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    init_logging(args.log_format);
    let args = Config::from(args);
    let listen = args.listen;
    args.validate()?;
    raise_open_file_limit();
    // Before `start`, which re-attaches sandboxes and cleans up after a predecessor: a
    // daemon that cannot serve stops before it does any of that. Connections that
    // come meanwhile wait in the backlog.
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let state = start(args).await?;
    crate::state::record_listen_address(&state.data_dir, listener.local_addr()?)?;
    spawn_background(&state, crate::filestore::EXPIRY_INTERVAL);
    brig_engine::boot::spawn_default_image_build(&state).await;
    tracing::info!(
        addr = %listener.local_addr().unwrap_or(listen),
        data_dir = %state.data_dir.display(),
        version = env!("CARGO_PKG_VERSION"),
        "brig serve is listening"
    );
    let signals = state.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        signals.begin_shutdown();
    });
    let result = run(listener, state.clone()).await;
    brig_engine::boot::stop(&state).await;
    result
}

/// Serves on `listener` until `state.begin_shutdown()` (which `serve` calls on
/// SIGTERM/SIGINT): then stops accepting, lets requests in flight finish for up to
/// [`SHUTDOWN_GRACE`], and returns.
///
/// Hand-written rather than `axum::serve`, which sets hyper no timer, so its header
/// timeout never runs, and caps nothing: a client that opens connections and sends
/// nothing kept each one (and its descriptor) forever, until the daemon could open
/// no more files and served nobody. Here a connection must send its headers within
/// `--header-timeout`, must read what it is sent within `--body-timeout`, and at
/// most [`connection_cap`] are open at once.
pub async fn run(listener: tokio::net::TcpListener, state: AppState) -> anyhow::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;
    use tower::ServiceExt;

    use crate::hyper_refusals::{Answered, Phase, Shaped};

    let app = router(state.clone());
    let cap = connection_cap(state.args.max_connections);
    let slots = Arc::new(tokio::sync::Semaphore::new(cap));
    // HTTP/1.1 only: the header timeout of HTTP/2-capable serving starts only once the
    // protocol is known, so a client that sends nothing would never time out (and
    // HTTP/2 without TLS, prior knowledge, is not what this API's clients speak).
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(state.args.header_timeout_ms));
    let write_timeout = Duration::from_millis(state.args.body_timeout_ms);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let accept = async {
        loop {
            // Semaphore::acquire_owned fails only once the semaphore is closed: never.
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return;
            };
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    wait_after_accept_error(e).await;
                    continue;
                }
            };
            // Responses and SSE chunks go out as they are written, not after the
            // client's delayed ACK of the previous segment.
            let _ = stream.set_nodelay(true);
            // A client that reads nothing of a response for --body-timeout loses its
            // connection: otherwise it holds the response (an exec's output escaped
            // into JSON is up to ~12 MB) for as long as it keeps the socket open.
            let mut stream = tokio_io_timeout::TimeoutStream::new(stream);
            stream.set_write_timeout(Some(write_timeout));
            // hyper's own refusals (a head it cannot parse) leave with the JSON body
            // every other error has: see `hyper_refusals`.
            let phase = Phase::default();
            let service = {
                let (called, ended) = (phase.clone(), phase.clone());
                ServiceExt::map_response(
                    ServiceExt::map_request(
                        app.clone(),
                        move |request: axum::http::Request<hyper::body::Incoming>| {
                            called.answering();
                            request
                        },
                    ),
                    move |response: Response| {
                        response
                            .map(|body| axum::body::Body::new(Answered::new(body, ended.clone())))
                    },
                )
            };
            let connection = builder.serve_connection(
                TokioIo::new(Shaped::new(Box::pin(stream), phase)),
                TowerToHyperService::new(service),
            );
            let connection = graceful.watch(connection);
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                drop(slot);
            });
        }
    };
    tokio::select! {
        () = accept => {}
        () = state.shutdown_requested() => {}
    }
    drop(listener);
    tracing::info!("shutting down: no new connections, finishing requests in flight");
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(SHUTDOWN_GRACE) => tracing::warn!(
            "requests still running {}s after shutdown began; exiting anyway",
            SHUTDOWN_GRACE.as_secs()
        ),
    }
    tracing::info!("stopped");
    Ok(())
}

/// `--max-connections`, held to a quarter of the open-file limit: each connection
/// is a descriptor, and the rest are for sandboxes, execs' pipes, files and the
/// database.
fn connection_cap(max_connections: usize) -> usize {
    crate::held_to_open_files(max_connections, 4, "--max-connections")
}

/// After a failed accept: a connection reset before it was accepted is nothing; out
/// of descriptors (or memory), wait for some to be closed instead of spinning.
async fn wait_after_accept_error(e: std::io::Error) {
    use std::io::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::ConnectionRefused | ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset
    ) {
        return;
    }
    tracing::error!(error = %e, "cannot accept a connection; retrying in 100 ms");
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// Raises the soft limit on open files to the hard one (service managers often start
/// daemons with a soft limit of 1024 and a far higher hard one): connections,
/// sessions and execs all take descriptors. Best effort: the cap on connections
/// follows whatever limit holds.
fn raise_open_file_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let limit = getrlimit(Resource::Nofile);
    if limit.current == limit.maximum {
        return;
    }
    let raised = rustix::process::Rlimit {
        current: limit.maximum,
        maximum: limit.maximum,
    };
    if let Err(e) = setrlimit(Resource::Nofile, raised) {
        tracing::warn!(error = %e, "cannot raise the open-file limit");
    }
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut stream) => {
                stream.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    let interrupt = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %e, "cannot listen for SIGINT");
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        () = terminate => tracing::info!("SIGTERM received"),
        () = interrupt => tracing::info!("SIGINT received"),
    }
}

#[cfg(test)]
#[path = "server_tests.rs"]
mod tests;
