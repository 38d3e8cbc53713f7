//! The E2B-compatible front end: E2B's SDKs, unchanged, pointed at brig with
//! `E2B_API_URL` and `E2B_SANDBOX_URL` set to the daemon's address.
//!
//! E2B has two planes. The control plane (`/sandboxes`, `/v2/sandboxes`, ...:
//! [`control`]) is called with an API key, brig's keys here. The sandbox plane is
//! what runs inside an E2B sandbox: envd, the in-sandbox daemon (port 49983: process
//! and filesystem services over Connect, `/files`, `/health`: [`envd`]), and the code
//! interpreter (port 49999: [`code`]). brig runs none of it inside the sandbox: the
//! daemon answers for them on top of its engine. The SDK names the sandbox and port
//! of each such request in the `E2b-Sandbox-Id` and `E2b-Sandbox-Port` headers, which
//! [`sandbox_plane`] reads before any route is matched.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use tower::ServiceExt;

use brig_engine::auth::{Caller, CallerSlot, Frontend};
use brig_engine::fault::ErrorCode;
use brig_engine::state::AppState;

pub mod code;
pub mod control;
pub mod envd;
pub mod tokens;

pub use tokens::TokenKey;

/// The envd version sandboxes report (`envdVersion`): the SDK enables features by
/// it, so it names the newest version whose features brig's envd really serves.
pub const ENVD_VERSION: &str = "0.5.7";

/// envd's port in every E2B sandbox.
pub const ENVD_PORT: u16 = 49983;
/// The code interpreter's port (e2b-code-interpreter's `JUPYTER_PORT`).
pub const CODE_PORT: u16 = 49999;
pub use control::{HOME, USER};

/// What a sandbox-plane handler is called for: the sandbox (a brig session id)
/// and the caller it acts for (the sandbox's tenant, front end `e2b`).
#[derive(Clone, Debug)]
pub struct SandboxCall {
    pub caller: Caller,
    pub session_id: String,
    /// Where relative paths, commands and code start: see [`home_of`].
    pub home: String,
}

/// The home of E2B's user in a sandbox: the one it was made with (E2B's creates
/// give [`HOME`]); else [`HOME`] in a sandbox made from an image, which E2B's
/// images have, and the working directory (`/workspace`) of one brig's API made on
/// the host's system dirs, whose root holds only what brig puts there.
pub fn home_of(session: &brig_engine::sessions::Session) -> String {
    if let Some(home) = &session.request.home {
        return home.clone();
    }
    let sandbox = session.sandbox();
    let facts = sandbox.facts();
    if facts.image.is_some() {
        HOME.to_string()
    } else {
        facts.cwd.clone()
    }
}

/// The routers of the sandbox plane, one per port, built once.
#[derive(Clone)]
pub struct Planes {
    state: AppState,
    envd: Router,
    code: Router,
    key: TokenKey,
}

impl Planes {
    pub fn new(state: &AppState, key: TokenKey) -> Planes {
        Planes {
            state: state.clone(),
            envd: envd::router().with_state(state.clone()),
            code: code::router().with_state(state.clone()),
            key,
        }
    }
}

/// An error in the shape E2B's API and its proxy answer with (`{"code": <status>,
/// "message"}` plus any `extra` fields), tagged with brig's code for the refusal
/// audit and metrics.
pub fn plain_error(
    status: StatusCode,
    code: ErrorCode,
    message: impl Into<String>,
    extra: serde_json::Value,
) -> Response {
    let mut body = serde_json::json!({"code": status.as_u16(), "message": message.into()});
    if let (Some(body), serde_json::Value::Object(extra)) = (body.as_object_mut(), extra) {
        body.extend(extra);
    }
    let mut response = (status, axum::Json(body)).into_response();
    response.extensions_mut().insert(code);
    response
}

/// What E2B's edge answers for a sandbox it does not know (the SDK reads a 502 as
/// "the sandbox was not found or timed out").
fn sandbox_not_found(sandbox_id: &str) -> Response {
    plain_error(
        StatusCode::BAD_GATEWAY,
        ErrorCode::NotFound,
        "The sandbox was not found",
        serde_json::json!({"sandboxId": sandbox_id}),
    )
}

/// Middleware (inside the refusal audit): a request naming a sandbox in
/// `E2b-Sandbox-Id` is the sandbox plane's, whatever its path; it is authenticated
/// and handed to the router of its `E2b-Sandbox-Port`. Every other request goes on
/// to brig's own routes.
pub async fn sandbox_plane(State(planes): State<Planes>, request: Request, next: Next) -> Response {
    let Some(sandbox_id) = request.headers().get("e2b-sandbox-id") else {
        return next.run(request).await;
    };
    let Ok(sandbox_id) = sandbox_id.to_str().map(|s| s.trim().to_string()) else {
        return plain_error(
            StatusCode::BAD_REQUEST,
            ErrorCode::BadRequest,
            "unreadable E2b-Sandbox-Id header",
            serde_json::Value::Null,
        );
    };
    let port = match request.headers().get("e2b-sandbox-port") {
        None => ENVD_PORT,
        Some(value) => match value
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse::<u16>().ok())
        {
            Some(port) => port,
            None => {
                return plain_error(
                    StatusCode::BAD_REQUEST,
                    ErrorCode::BadRequest,
                    "E2b-Sandbox-Port must be a port number",
                    serde_json::Value::Null,
                )
            }
        },
    };
    let mut request = request;
    let is_health = request.uri().path() == "/health";
    let (caller, home) =
        match authorize(&planes, &sandbox_id, port, is_health, request.headers()).await {
            Ok(found) => found,
            Err(refusal) => return *refusal,
        };
    if let Some(slot) = request.extensions().get::<CallerSlot>() {
        let _ = slot.0.set(caller.clone());
    }
    request.extensions_mut().insert(caller.clone());
    request.extensions_mut().insert(SandboxCall {
        caller,
        session_id: sandbox_id.clone(),
        home,
    });
    let router = match port {
        ENVD_PORT => planes.envd.clone(),
        CODE_PORT => planes.code.clone(),
        _ => {
            return plain_error(
                StatusCode::BAD_GATEWAY,
                ErrorCode::NotFound,
                "The sandbox is running but port is not open",
                serde_json::json!({"sandboxId": sandbox_id, "port": port}),
            )
        }
    };
    // Router's service never fails (Infallible).
    match router.oneshot(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    }
}

/// The caller a sandbox-plane request acts for, or the refusal to answer it with.
///
/// A sandbox's own tokens (as the SDK sends them) stand for the sandbox's tenant:
/// `X-Access-Token` reaches every port, `E2B-Traffic-Access-Token` every port but
/// envd's. Without a valid token, a brig key of the sandbox's tenant (or an admin
/// key) does. envd's `/health` needs neither, as in E2B. Another tenant's sandbox
/// is answered as one that does not exist.
async fn authorize(
    planes: &Planes,
    sandbox_id: &str,
    port: u16,
    is_health: bool,
    headers: &HeaderMap,
) -> Result<(Caller, String), Box<Response>> {
    let state = &planes.state;
    let Some(session) = state
        .sessions()
        .get(sandbox_id)
        .filter(|s| !s.deleted.load(std::sync::atomic::Ordering::SeqCst))
    else {
        return Err(Box::new(sandbox_not_found(sandbox_id)));
    };
    let home = home_of(&session);
    // E2B's edge routes to running sandboxes only: a paused one is not there until
    // it is resumed (connect), and the SDK reads the 502 as "not running". Said
    // only to whoever may reach the sandbox.
    let paused = session.paused.load(std::sync::atomic::Ordering::SeqCst);
    let as_tenant = || {
        if paused {
            return Err(Box::new(plain_error(
                StatusCode::BAD_GATEWAY,
                ErrorCode::Conflict,
                "The sandbox is paused; connect to it to resume it",
                serde_json::json!({"sandboxId": sandbox_id}),
            )));
        }
        let caller = Caller {
            tenant: session.tenant.clone(),
            key_id: None,
            admin: false,
            frontend: Frontend::E2b,
        };
        Ok((caller, home.clone()))
    };
    let token = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(presented) = token("x-access-token") {
        if planes.key.verify(tokens::Kind::Envd, sandbox_id, presented) {
            return as_tenant();
        }
    }
    if let Some(presented) = token("e2b-traffic-access-token") {
        if port != ENVD_PORT
            && planes
                .key
                .verify(tokens::Kind::Traffic, sandbox_id, presented)
        {
            return as_tenant();
        }
    }
    if port == ENVD_PORT && is_health {
        return as_tenant();
    }
    if let Some(caller) = key_caller(state, headers).await {
        if caller.tenant == session.tenant || caller.admin {
            return as_tenant().map(|(_, home)| {
                let caller = Caller {
                    frontend: Frontend::E2b,
                    ..caller
                };
                (caller, home)
            });
        }
        return Err(Box::new(sandbox_not_found(sandbox_id)));
    }
    Err(Box::new(plain_error(
        StatusCode::UNAUTHORIZED,
        ErrorCode::Unauthorized,
        "this sandbox needs its access token (X-Access-Token) or an API key",
        serde_json::Value::Null,
    )))
}

/// The caller of a brig API key in the request, if it carries a valid one (or,
/// under `--no-auth`, none at all).
async fn key_caller(state: &AppState, headers: &HeaderMap) -> Option<Caller> {
    // envd's calls name their user in Basic auth: that is no key.
    let mut headers = headers.clone();
    let basic = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().to_ascii_lowercase().starts_with("basic "));
    if basic {
        headers.remove(axum::http::header::AUTHORIZATION);
    }
    let headers = &headers;
    let key = crate::http::presented_key(headers).ok()?;
    if key.is_none() && headers.contains_key("x-access-token") {
        // A wrong token is not an anonymous request, even under --no-auth.
        return None;
    }
    state.auth.authenticate(key).await.ok()
}
