//! E2B's control plane: sandboxes created, listed, connected to, paused, resumed,
//! timed out, snapshotted, forked and killed with an API key (brig's keys), on top
//! of brig's sessions. The fields and statuses are those of E2B's OpenAPI spec as
//! the SDK (e2b 2.63) reads them; every error is `{"code": <status>, "message"}`.
//!
//! An E2B sandbox is a brig session: its id is the session's, its `timeout` the
//! session's TTL (no idle timeout: E2B has none), pause and resume brig's freeze,
//! its template an image (`--e2b-template`), or a snapshot of the caller's.

mod copies;
mod extract;
mod rules;
mod wire;

use axum::extract::{Extension, RawQuery, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use serde::Deserialize;

use brig_engine::auth::Caller;
use brig_engine::fault::{Error, ErrorCode};
use brig_engine::sessions::{self, snapshots, CreateSession, SessionInfo, UpdateSession};
use brig_engine::state::AppState;

use super::tokens::{Kind, TokenKey};
use extract::{E2bCaller, E2bError, E2bJson, E2bPath, E2bResult};
use wire::{ConnectRequest, NewSandbox};

pub use wire::TEMPLATE_KEY;

/// The home of an E2B sandbox's user, and its commands' working directory.
pub const HOME: &str = "/home/user";
/// The user E2B's SDK runs commands as.
pub const USER: &str = "user";

/// E2B's default `timeout` of a new sandbox, in seconds.
const DEFAULT_TIMEOUT: i64 = 300;
/// Of a sandbox resumed (`ResumedSandbox`) or forked.
const RESUME_TIMEOUT: i64 = 15;
/// How long a paused sandbox is kept: E2B keeps paused sandboxes until they are
/// resumed or killed (its timeout runs only while it runs), within its retention
/// of paused sandboxes, 30 days.
const PAUSED_KEEP: u64 = 30 * 24 * 3600;
/// The most forks one request may ask for.
const MAX_FORKS: i64 = 16;

/// The control plane's routes: every path under E2B's prefixes answers in E2B's
/// shape, unknown ones included.
pub fn routes() -> Router<AppState> {
    let sandboxes = Router::new()
        .route("/", post(create).get(list_v1))
        .route("/{id}", get(get_sandbox).delete(kill))
        .route("/{id}/timeout", post(set_timeout))
        .route("/{id}/refreshes", post(refresh))
        .route("/{id}/connect", post(connect))
        .route("/{id}/pause", post(pause))
        .route("/{id}/resume", post(resume))
        .route("/{id}/snapshots", post(copies::snapshot))
        .route("/{id}/fork", post(copies::fork))
        .route("/{id}/network", put(update_network))
        .route("/{id}/metrics", get(not_recorded))
        .route("/{id}/logs", get(not_recorded))
        .route("/metrics", get(not_recorded));
    let v2 = Router::new()
        .route("/", post(create).get(list_v2))
        .route("/{id}/connect", post(connect))
        .route("/{id}/logs", get(not_recorded));
    let templates = Router::new().route("/{id}", delete(copies::delete_template));
    let listing = Router::new().route("/", get(copies::list_snapshots));
    [
        ("/sandboxes", sandboxes),
        ("/v2/sandboxes", v2),
        ("/templates", templates),
        ("/snapshots", listing),
    ]
    .into_iter()
    .fold(Router::new(), |router, (prefix, routes)| {
        router.nest(
            prefix,
            routes
                .fallback(extract::no_route)
                .method_not_allowed_fallback(extract::wrong_method),
        )
    })
}

/// A sandbox and its access tokens (derived from the daemon's key).
fn sandbox_json(key: &TokenKey, info: &SessionInfo) -> wire::Sandbox {
    let id = &info.session_id;
    wire::sandbox(
        info,
        (key.token(Kind::Envd, id), key.token(Kind::Traffic, id)),
    )
}

/// E2B's 404 for a sandbox the caller does not have (none, or another tenant's).
fn not_found(id: &str) -> E2bError {
    E2bError(Error::not_found(format!(
        "sandbox \"{id}\" doesn't exist or you don't have access to it"
    )))
}

/// The engine's error, with its not-found said as E2B says it of sandboxes.
fn about(id: &str) -> impl Fn(Error) -> E2bError + '_ {
    move |e| {
        if e.code == ErrorCode::NotFound {
            not_found(id)
        } else {
            E2bError(e)
        }
    }
}

/// A positive number of seconds.
fn seconds(value: i64, field: &str) -> Result<u64, Error> {
    u64::try_from(value)
        .ok()
        .filter(|s| *s > 0)
        .ok_or_else(|| Error::invalid(format!("{field} must be a positive number of seconds")))
}

fn refuse_if(condition: bool, what: &str) -> Result<(), Error> {
    if condition {
        return Err(Error::invalid(format!("{what} is not supported by brig")));
    }
    Ok(())
}

/// `POST /sandboxes`, `POST /v2/sandboxes`: 201 with the sandbox and its tokens.
async fn create(
    State(state): State<AppState>,
    Extension(key): Extension<TokenKey>,
    E2bCaller(caller): E2bCaller,
    E2bJson(body): E2bJson<NewSandbox>,
) -> E2bResult<Response> {
    refuse_if(
        body.mcp.as_ref().is_some_and(|m| !m.is_null()),
        "mcp (MCP servers inside sandboxes; brig has its own MCP front end: `brig mcp`)",
    )?;
    refuse_if(
        body.auto_pause == Some(true) && body.auto_pause_memory == Some(false),
        "a filesystem-only auto-pause (autoPauseMemory: false)",
    )?;
    refuse_if(
        body.auto_resume
            .as_ref()
            .is_some_and(|r| r["enabled"] == serde_json::Value::Bool(true)),
        "autoResume",
    )?;
    refuse_if(
        body.iam
            .as_ref()
            .is_some_and(|i| i["tokens"].as_object().is_some_and(|t| !t.is_empty())),
        "iam",
    )?;
    refuse_if(
        body.volume_mounts.as_ref().is_some_and(|v| !v.is_empty()),
        "volumeMounts",
    )?;
    let timeout = seconds(body.timeout.unwrap_or(DEFAULT_TIMEOUT), "timeout")?;
    let template = body.template_id.trim().to_string();
    // A snapshot of the caller's is a template too (E2B's snapshots are).
    let (image, snapshot) = match snapshots::get(&state, &caller, &template).await {
        Ok(found) => (None, Some(found.snapshot_id)),
        Err(e) if e.code == ErrorCode::NotFound => (rules::image_of(&state.args, &template)?, None),
        Err(e) => return Err(e.into()),
    };
    let network = rules::network_of(body.allow_internet_access, body.network.as_ref())?;
    let mut env = body.env_vars.unwrap_or_default();
    env.entry("HOME".into()).or_insert_with(|| HOME.into());
    env.entry("USER".into()).or_insert_with(|| USER.into());
    let request = CreateSession {
        image,
        snapshot,
        env: Some(env),
        ttl_seconds: Some(timeout),
        // E2B's sandboxes end at their timeout only.
        idle_timeout_seconds: Some(0),
        metadata: Some(rules::labels(body.metadata, &template)?),
        network,
        home: Some(HOME.into()),
        user: Some(USER.into()),
        pause_at_expiry: (body.auto_pause == Some(true)).then_some(PAUSED_KEEP),
        ..CreateSession::default()
    };
    let info = sessions::create_session(&state, &caller, request).await?;
    Ok((StatusCode::CREATED, Json(sandbox_json(&key, &info))).into_response())
}

/// `GET /sandboxes/{id}`.
async fn get_sandbox(
    State(state): State<AppState>,
    Extension(key): Extension<TokenKey>,
    E2bCaller(caller): E2bCaller,
    E2bPath(id): E2bPath,
) -> E2bResult<Json<serde_json::Value>> {
    let session = sessions::lookup(&state, &caller, &id).map_err(about(&id))?;
    let info = session.info();
    let token = key.token(Kind::Envd, &info.session_id);
    let pauses = session.request.pause_at_expiry.is_some();
    Ok(Json(wire::detail(&info, token, pauses)))
}

/// `DELETE /sandboxes/{id}`: 204; 404 for one the caller does not have.
async fn kill(
    State(state): State<AppState>,
    E2bCaller(caller): E2bCaller,
    E2bPath(id): E2bPath,
) -> E2bResult<StatusCode> {
    sessions::delete_session(&state, &caller, &id)
        .await
        .map_err(about(&id))?;
    Ok(StatusCode::NO_CONTENT)
}

/// The caller's sessions with every label of the `metadata` filter.
fn matching(
    state: &AppState,
    caller: &Caller,
    metadata: Option<&str>,
) -> E2bResult<Vec<SessionInfo>> {
    let wanted = rules::metadata_filter(metadata);
    Ok(sessions::list_sessions(state, caller, &wanted)?)
}

#[derive(Debug, Default, Deserialize)]
struct ListQuery {
    metadata: Option<String>,
    #[serde(default)]
    state: Vec<String>,
    order: Option<String>,
    #[serde(rename = "startedAfter")]
    started_after: Option<String>,
    template: Option<String>,
    #[serde(rename = "nextToken")]
    next_token: Option<String>,
    limit: Option<String>,
}

/// The query of a list; `state` may come as `state=a,b` or `state=a&state=b`.
fn list_query(raw: Option<&str>) -> Result<ListQuery, Error> {
    let mut query = ListQuery::default();
    for (name, value) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        let value = value.into_owned();
        match name.as_ref() {
            "metadata" => query.metadata = Some(value),
            "state" => query.state.push(value),
            "order" => query.order = Some(value),
            "startedAfter" => query.started_after = Some(value),
            "template" => query.template = Some(value),
            "nextToken" => query.next_token = Some(value),
            "limit" => query.limit = Some(value),
            _ => {}
        }
    }
    Ok(query)
}

/// `GET /sandboxes` (v1): the caller's running sandboxes the metadata filter keeps.
async fn list_v1(
    State(state): State<AppState>,
    E2bCaller(caller): E2bCaller,
    RawQuery(raw): RawQuery,
) -> E2bResult<Json<Vec<serde_json::Value>>> {
    let query = list_query(raw.as_deref())?;
    let running = rules::ListFilter {
        states: vec!["running".into()],
        ..rules::ListFilter::default()
    };
    let found = rules::filtered(
        matching(&state, &caller, query.metadata.as_deref())?,
        &running,
    );
    Ok(Json(found.iter().map(wire::listed).collect()))
}

/// `GET /v2/sandboxes`: a page, the next page's token in `x-next-token`.
async fn list_v2(
    State(state): State<AppState>,
    E2bCaller(caller): E2bCaller,
    RawQuery(raw): RawQuery,
) -> E2bResult<Response> {
    let query = list_query(raw.as_deref())?;
    let filter = rules::ListFilter {
        states: rules::states(&query.state)?,
        template: query.template.clone(),
        started_after: match &query.started_after {
            None => None,
            Some(at) => Some(sessions::parse_rfc3339(at).ok_or_else(|| {
                Error::invalid(format!("startedAfter {at:?} is not an RFC 3339 time"))
            })?),
        },
        ascending: match query.order.as_deref() {
            None | Some("desc") => false,
            Some("asc") => true,
            Some(other) => {
                return Err(Error::invalid(format!("order {other:?}: use asc or desc")).into())
            }
        },
    };
    let limit = match &query.limit {
        None => None,
        Some(text) => Some(
            text.trim()
                .parse::<i64>()
                .map_err(|_| Error::invalid(format!("limit {text:?} is not a number")))?,
        ),
    };
    let found = rules::filtered(
        matching(&state, &caller, query.metadata.as_deref())?,
        &filter,
    );
    let (page, next) = rules::page(found, &filter, limit, query.next_token.as_deref())?;
    let mut response = Json(page.iter().map(wire::listed).collect::<Vec<_>>()).into_response();
    if let Some(next) = next.and_then(|n| HeaderValue::from_str(&n).ok()) {
        response.headers_mut().insert("x-next-token", next);
    }
    Ok(response)
}

/// The session now ends `seconds` from now.
async fn end_in(
    state: &AppState,
    caller: &Caller,
    id: &str,
    seconds: u64,
) -> E2bResult<SessionInfo> {
    let update = UpdateSession {
        ttl_seconds: Some(seconds),
        ..UpdateSession::default()
    };
    sessions::update_session(state, caller, id, update)
        .await
        .map_err(about(id))
}

/// The session ends no sooner than `seconds` from now (connect and refresh only
/// ever extend a sandbox's life, as E2B's do).
async fn end_no_sooner(
    state: &AppState,
    caller: &Caller,
    id: &str,
    seconds: u64,
) -> E2bResult<SessionInfo> {
    let info = sessions::get_session(state, caller, id).map_err(about(id))?;
    let wanted = sessions::unix_now().saturating_add(seconds as i64);
    let ends = info.expires_at.as_deref().and_then(sessions::parse_rfc3339);
    if ends.is_none_or(|end| end >= wanted) {
        return Ok(info);
    }
    end_in(state, caller, id, seconds).await
}

/// `POST /sandboxes/{id}/timeout`: the sandbox now ends `timeout` seconds from
/// now (sooner or later than before); 0 ends it now, as E2B's does. 204.
async fn set_timeout(
    State(state): State<AppState>,
    E2bCaller(caller): E2bCaller,
    E2bPath(id): E2bPath,
    E2bJson(body): E2bJson<wire::TimeoutRequest>,
) -> E2bResult<StatusCode> {
    if body.timeout == 0 {
        sessions::delete_session(&state, &caller, &id)
            .await
            .map_err(about(&id))?;
        return Ok(StatusCode::NO_CONTENT);
    }
    let seconds = seconds(body.timeout, "timeout")?;
    end_in(&state, &caller, &id, seconds).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/refreshes`: keeps the sandbox alive `duration` seconds
/// more (E2B's default: its timeout again, here 300 s). 204.
async fn refresh(
    State(state): State<AppState>,
    E2bCaller(caller): E2bCaller,
    E2bPath(id): E2bPath,
    E2bJson(body): E2bJson<wire::RefreshRequest>,
) -> E2bResult<StatusCode> {
    let seconds = seconds(body.duration.unwrap_or(DEFAULT_TIMEOUT), "duration")?;
    end_no_sooner(&state, &caller, &id, seconds).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/connect` (v1 and v2): the sandbox, resumed if it was
/// paused (201), as it was if running (200); it ends no sooner than `timeout`
/// seconds from now.
async fn connect(
    State(state): State<AppState>,
    Extension(key): Extension<TokenKey>,
    E2bCaller(caller): E2bCaller,
    E2bPath(id): E2bPath,
    E2bJson(body): E2bJson<ConnectRequest>,
) -> E2bResult<Response> {
    refuse_if(
        body.memory == Some(false),
        "resuming without memory (memory: false)",
    )?;
    let seconds = seconds(body.timeout.unwrap_or(DEFAULT_TIMEOUT), "timeout")?;
    let info = sessions::get_session(&state, &caller, &id).map_err(about(&id))?;
    let (status, info) = if info.state == "paused" {
        sessions::set_paused(&state, &caller, &id, false)
            .await
            .map_err(about(&id))?;
        // Its clock runs again from now.
        (
            StatusCode::CREATED,
            end_in(&state, &caller, &id, seconds).await?,
        )
    } else {
        (
            StatusCode::OK,
            end_no_sooner(&state, &caller, &id, seconds).await?,
        )
    };
    Ok((status, Json(sandbox_json(&key, &info))).into_response())
}

/// `POST /sandboxes/{id}/pause`: 204; 409 if it is paused already. Its timeout
/// stops: it is kept [`PAUSED_KEEP`] until connected to, resumed or killed.
async fn pause(
    State(state): State<AppState>,
    E2bCaller(caller): E2bCaller,
    E2bPath(id): E2bPath,
    E2bJson(body): E2bJson<wire::PauseRequest>,
) -> E2bResult<StatusCode> {
    refuse_if(
        body.memory == Some(false),
        "pausing without memory (memory: false)",
    )?;
    let info = sessions::get_session(&state, &caller, &id).map_err(about(&id))?;
    if info.state == "paused" {
        return Err(Error::conflict(format!("sandbox \"{id}\" is already paused")).into());
    }
    sessions::set_paused(&state, &caller, &id, true)
        .await
        .map_err(about(&id))?;
    end_in(&state, &caller, &id, PAUSED_KEEP).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/resume` (deprecated by connect): 201; 409 if running.
async fn resume(
    State(state): State<AppState>,
    Extension(key): Extension<TokenKey>,
    E2bCaller(caller): E2bCaller,
    E2bPath(id): E2bPath,
    E2bJson(body): E2bJson<ConnectRequest>,
) -> E2bResult<Response> {
    refuse_if(body.auto_pause == Some(true), "autoPause")?;
    refuse_if(
        body.memory == Some(false),
        "resuming without memory (memory: false)",
    )?;
    let seconds = seconds(body.timeout.unwrap_or(RESUME_TIMEOUT), "timeout")?;
    let info = sessions::get_session(&state, &caller, &id).map_err(about(&id))?;
    if info.state != "paused" {
        return Err(Error::conflict(format!("sandbox \"{id}\" is already running")).into());
    }
    sessions::set_paused(&state, &caller, &id, false)
        .await
        .map_err(about(&id))?;
    let info = end_in(&state, &caller, &id, seconds).await?;
    Ok((StatusCode::CREATED, Json(sandbox_json(&key, &info))).into_response())
}

/// `PUT /sandboxes/{id}/network`: the sandbox's egress from now on. 204.
async fn update_network(
    State(state): State<AppState>,
    E2bCaller(caller): E2bCaller,
    E2bPath(id): E2bPath,
    E2bJson(body): E2bJson<wire::NetworkConfig>,
) -> E2bResult<StatusCode> {
    // An update that names nothing opens the way out again, as E2B's does.
    let network = rules::network_of(None, Some(&body))?.unwrap_or(brig_engine::egress::Network {
        mode: "open".into(),
        allow: Vec::new(),
        deny: Vec::new(),
    });
    let update = UpdateSession {
        network: Some(network),
        ..UpdateSession::default()
    };
    sessions::update_session(&state, &caller, &id, update)
        .await
        .map_err(about(&id))?;
    Ok(StatusCode::NO_CONTENT)
}

/// Metrics and logs over time: brig records neither. 501 rather than made-up
/// numbers; `GET /v1/sessions/{id}/stats` has a session's figures now.
async fn not_recorded(E2bCaller(_caller): E2bCaller) -> Response {
    super::plain_error(
        StatusCode::NOT_IMPLEMENTED,
        ErrorCode::Unavailable,
        "brig records no sandbox metrics or logs over time; GET /v1/sessions/{id}/stats \
         with the same key has a sandbox's use now",
        serde_json::Value::Null,
    )
}
