//! `/v1/sessions`: create, list, get, update (`PATCH`), delete, pause, resume, and a
//! session's stats. The wire types are the API's (their doc comments are the
//! OpenAPI document's descriptions); the engine's verbs take and give its own.

use std::collections::BTreeMap;

use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use brig_engine::fault::Error;
use brig_engine::sessions::{self, stats};
use brig_engine::state::AppState;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::http::{ApiJson, ApiPath, Authed, HttpResult};

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_session, list_sessions))
        .routes(routes!(get_session, update_session, delete_session))
        .routes(routes!(pause_session))
        .routes(routes!(resume_session))
        .routes(routes!(session_stats))
}

/// A size as a string with a unit (`"512M"`) or a number of bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Size {
    Bytes(u64),
    Text(String),
}

impl From<Size> for sessions::Size {
    fn from(size: Size) -> sessions::Size {
        match size {
            Size::Bytes(n) => sessions::Size::Bytes(n),
            Size::Text(t) => sessions::Size::Text(t),
        }
    }
}

/// `cpus` is taken as any JSON value and checked by hand (a number or a numeric
/// string); the document says which values those are.
fn cpus_schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
    use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Type};
    OneOfBuilder::new()
        .item(
            ObjectBuilder::new()
                .schema_type(Type::Number)
                .examples([0.5]),
        )
        .item(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .examples(["1.5"]),
        )
        .item(ObjectBuilder::new().schema_type(Type::Null))
        .description(Some("CPUs, fractional allowed (e.g. 0.5 or \"1.5\")."))
        .into()
}

/// Limits of a session's sandbox; each defaults to `brig run`'s default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionLimits {
    /// Memory of the whole sandbox, tmpfs included (e.g. "512M").
    pub memory: Option<Size>,
    pub pids: Option<u64>,
    /// CPUs, fractional allowed (e.g. 0.5 or "1.5").
    #[schema(schema_with = cpus_schema)]
    pub cpus: Option<serde_json::Value>,
    /// All writable storage together (the upper layer, /tmp, /workspace).
    pub disk: Option<Size>,
    pub nofile: Option<u64>,
    pub file_size: Option<Size>,
}

impl From<SessionLimits> for sessions::SessionLimits {
    fn from(limits: SessionLimits) -> sessions::SessionLimits {
        let SessionLimits {
            memory,
            pids,
            cpus,
            disk,
            nofile,
            file_size,
        } = limits;
        sessions::SessionLimits {
            memory: memory.map(Into::into),
            pids,
            cpus,
            disk: disk.map(Into::into),
            nofile,
            file_size: file_size.map(Into::into),
        }
    }
}

/// A file uploaded through `/v1/files`, placed into the session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FileRef {
    /// Relative to the working directory (/workspace); no `..`.
    pub path: String,
    pub file_id: String,
}

impl From<FileRef> for sessions::FileRef {
    fn from(FileRef { path, file_id }: FileRef) -> sessions::FileRef {
        sessions::FileRef { path, file_id }
    }
}

/// An uploaded tar bundle mounted read-only.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BundleMount {
    pub file_id: String,
    /// Absolute path inside the sandbox.
    pub path: String,
}

impl From<BundleMount> for sessions::BundleMount {
    fn from(BundleMount { file_id, path }: BundleMount) -> sessions::BundleMount {
        sessions::BundleMount { file_id, path }
    }
}

impl From<sessions::BundleMount> for BundleMount {
    fn from(sessions::BundleMount { file_id, path }: sessions::BundleMount) -> BundleMount {
        BundleMount { file_id, path }
    }
}

/// Where a session may connect: `none` (loopback only, the default), `allow` (only
/// the `allow` rules), `open` (any public address). Rules are `PATTERN[:PORTS]`
/// (`example.com`, `*.example.com`, an IP or a CIDR; ports `443`, `80,443`,
/// `8000-9000`); `deny` wins over `allow`. Loopback, private, link-local, CGNAT,
/// multicast and metadata addresses are never reached unless the operator opened
/// a range (`--egress-allow-private`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Network {
    /// `none`, `allow` or `open`.
    #[serde(default = "mode_none")]
    pub mode: String,
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default)]
    pub deny: Vec<String>,
}

fn mode_none() -> String {
    "none".into()
}

impl From<Network> for brig_engine::egress::Network {
    fn from(Network { mode, allow, deny }: Network) -> brig_engine::egress::Network {
        brig_engine::egress::Network { mode, allow, deny }
    }
}

impl From<brig_engine::egress::Network> for Network {
    fn from(
        brig_engine::egress::Network { mode, allow, deny }: brig_engine::egress::Network,
    ) -> Network {
        Network { mode, allow, deny }
    }
}

/// A secret's value; never printed (`Debug` shows `<redacted>`) nor serialized.
#[derive(Clone, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(transparent)]
#[schema(value_type = String)]
pub struct SecretValue(String);

impl std::fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("\"<redacted>\"")
    }
}

/// A secret the sandbox sees only as a placeholder in its variable `name`; the
/// session's proxy puts `value` into requests toward `hosts` only, and refuses
/// (and audits) a request carrying the placeholder anywhere else.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Secret {
    /// An environment variable's name (letters, digits, `_`; at most 64), unique.
    pub name: String,
    /// Never returned, logged or audited. No line breaks or NUL.
    pub value: SecretValue,
    /// `example.com` or `*.example.com` (no IPs, no ports): where the value may go.
    pub hosts: Vec<String>,
}

impl From<Secret> for brig_engine::secrets::SecretRequest {
    fn from(Secret { name, value, hosts }: Secret) -> Self {
        brig_engine::secrets::SecretRequest {
            name,
            value: brig_engine::secrets::SecretValue(value.0),
            hosts,
        }
    }
}

/// What a session shows of a secret: never its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SecretInfo {
    pub name: String,
    pub hosts: Vec<String>,
    /// What the sandbox holds instead of the value (worthless anywhere else),
    /// for putting into a file rather than reading the variable.
    pub placeholder: String,
}

impl From<brig_engine::secrets::SecretInfo> for SecretInfo {
    fn from(
        brig_engine::secrets::SecretInfo {
            name,
            hosts,
            placeholder,
        }: brig_engine::secrets::SecretInfo,
    ) -> Self {
        SecretInfo {
            name,
            hosts,
            placeholder,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSession {
    pub image: Option<String>,
    pub snapshot: Option<String>,
    pub env: Option<BTreeMap<String, String>>,
    pub limits: Option<SessionLimits>,
    /// Uploaded tar bundles bound read-only. A fork (`snapshot`) without `mounts`
    /// gets the mounts of the session its snapshot was taken from.
    pub mounts: Option<Vec<BundleMount>>,
    /// The tenant's persistent volume of that name, read-write at `/volume`
    /// (created on first use).
    pub volume: Option<String>,
    /// The capacity of `volume` when this request makes it (default 1 GiB; fixed
    /// once made: another value for an existing volume is 409), e.g. "10G".
    pub volume_size: Option<Size>,
    pub files: Option<Vec<FileRef>>,
    #[schema(minimum = 1)]
    pub ttl_seconds: Option<u64>,
    pub idle_timeout_seconds: Option<u64>,
    /// The caller's own labels (e.g. `{"user": "u42", "chat": "c7"}`), returned with
    /// the session and matched by `GET /v1/sessions?metadata=K=V`: at most
    /// 16 entries, keys 1-64 characters of `A-Z a-z 0-9 _ . -`, values at most 256
    /// bytes.
    pub metadata: Option<BTreeMap<String, String>>,
    /// Where the session may connect; the daemon's `--session-network` when absent
    /// (a fork: the policy of its snapshot's session).
    pub network: Option<Network>,
    /// Secrets the sandbox never sees; they need a network mode other than
    /// `none`. A fork gets only those its own request gives.
    pub secrets: Option<Vec<Secret>>,
}

impl From<CreateSession> for sessions::CreateSession {
    fn from(request: CreateSession) -> sessions::CreateSession {
        let CreateSession {
            image,
            snapshot,
            env,
            limits,
            mounts,
            volume,
            volume_size,
            files,
            ttl_seconds,
            idle_timeout_seconds,
            metadata,
            network,
            secrets,
        } = request;
        sessions::CreateSession {
            image,
            snapshot,
            env,
            limits: limits.map(Into::into),
            mounts: mounts.map(|m| m.into_iter().map(Into::into).collect()),
            volume,
            volume_size: volume_size.map(Into::into),
            files: files.map(|f| f.into_iter().map(Into::into).collect()),
            ttl_seconds,
            idle_timeout_seconds,
            metadata,
            network: network.map(Into::into),
            secrets: secrets.map(|list| list.into_iter().map(Into::into).collect()),
            home: None,
            user: None,
            pause_at_expiry: None,
        }
    }
}

/// `PATCH /v1/sessions/{id}`: what can change in a live session. Fields left out
/// stay as they are.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateSession {
    /// The session now ends this many seconds from now: a keep-alive for a session
    /// still in use near its end, or an earlier end.
    #[schema(minimum = 1)]
    pub ttl_seconds: Option<u64>,
    /// A new idle timeout; 0 for none.
    pub idle_timeout_seconds: Option<u64>,
    /// Replaces the labels, all of them (`{}` removes them); the bounds of create's.
    pub metadata: Option<BTreeMap<String, String>>,
    /// Replaces the network policy for connections made from now on (open ones go
    /// on). An invalid one is 400 and the old stays; a session started with mode
    /// `none` has no way out to open (409).
    pub network: Option<Network>,
}

impl From<UpdateSession> for sessions::UpdateSession {
    fn from(update: UpdateSession) -> sessions::UpdateSession {
        let UpdateSession {
            ttl_seconds,
            idle_timeout_seconds,
            metadata,
            network,
        } = update;
        sessions::UpdateSession {
            ttl_seconds,
            idle_timeout_seconds,
            metadata,
            network: network.map(Into::into),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SessionInfo {
    pub session_id: String,
    /// "running" or "paused".
    pub state: String,
    pub image: Option<String>,
    pub snapshot: Option<String>,
    pub created_at: String,
    pub expires_at: Option<String>,
    pub idle_timeout_seconds: Option<u64>,
    pub last_active_at: String,
    /// Whether the sandbox came ready-made from the warm pool.
    pub pooled: bool,
    /// Bundles bound read-only.
    pub mounts: Vec<BundleMount>,
    /// The volume mounted at `/volume`.
    pub volume: Option<String>,
    /// The caller's labels (given at create, replaced by `PATCH`).
    pub metadata: BTreeMap<String, String>,
    /// The network policy in force.
    pub network: Network,
    /// Its secrets: names, hosts and placeholders, never values.
    pub secrets: Vec<SecretInfo>,
    #[schema(value_type = Object)]
    pub limits: serde_json::Value,
    /// What isolation the sandbox really has (as `brig run --json`'s `enforced`).
    #[schema(value_type = Object)]
    pub enforced: serde_json::Value,
}

impl From<sessions::SessionInfo> for SessionInfo {
    fn from(info: sessions::SessionInfo) -> SessionInfo {
        let sessions::SessionInfo {
            session_id,
            state,
            image,
            snapshot,
            created_at,
            expires_at,
            idle_timeout_seconds,
            last_active_at,
            pooled,
            mounts,
            volume,
            metadata,
            network,
            secrets,
            limits,
            enforced,
        } = info;
        SessionInfo {
            session_id,
            state,
            image,
            snapshot,
            created_at,
            expires_at,
            idle_timeout_seconds,
            last_active_at,
            pooled,
            mounts: mounts.into_iter().map(Into::into).collect(),
            volume,
            metadata,
            network: network.into(),
            secrets: secrets.into_iter().map(Into::into).collect(),
            limits,
            enforced,
        }
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SessionList {
    pub sessions: Vec<SessionInfo>,
}

/// A session's use of its resources, read when asked. A value the host does not
/// report is null.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SessionStats {
    pub session_id: String,
    /// Memory charged to the session now: its processes', and the page cache and
    /// the files it wrote (`/tmp`, `/workspace` and changes to the image are in
    /// memory), as its memory limit counts them.
    pub memory_bytes: Option<u64>,
    /// The most memory charged to it at once so far.
    pub memory_peak_bytes: Option<u64>,
    pub memory_limit_bytes: Option<u64>,
    /// CPU time used by all its processes since it started.
    pub cpu_seconds: Option<f64>,
    /// CPU bandwidth it may use, in CPUs.
    pub cpus_limit: Option<f64>,
    /// Processes and threads now.
    pub tasks: Option<u64>,
    pub tasks_limit: Option<u64>,
    /// Bytes its writes take of its writable storage (`limits.disk`); its volume
    /// is counted apart.
    pub disk_used_bytes: Option<u64>,
    pub disk_limit_bytes: u64,
    /// With a volume: bytes in use on it (what `df` calls Used, shared with the
    /// other sessions that mount it), and its size as its filesystem reports it (a
    /// little less than its capacity: the filesystem's own structures).
    pub volume_used_bytes: Option<u64>,
    pub volume_size_bytes: Option<u64>,
    /// Processes in it killed for want of memory.
    pub oom_kills: u64,
}

impl From<stats::SessionStats> for SessionStats {
    fn from(stats: stats::SessionStats) -> SessionStats {
        let stats::SessionStats {
            session_id,
            memory_bytes,
            memory_peak_bytes,
            memory_limit_bytes,
            cpu_seconds,
            cpus_limit,
            tasks,
            tasks_limit,
            disk_used_bytes,
            disk_limit_bytes,
            volume_used_bytes,
            volume_size_bytes,
            oom_kills,
        } = stats;
        SessionStats {
            session_id,
            memory_bytes,
            memory_peak_bytes,
            memory_limit_bytes,
            cpu_seconds,
            cpus_limit,
            tasks,
            tasks_limit,
            disk_used_bytes,
            disk_limit_bytes,
            volume_used_bytes,
            volume_size_bytes,
            oom_kills,
        }
    }
}

#[utoipa::path(post, path = "/v1/sessions", tag = "sessions",
    request_body = CreateSession,
    responses((status = 201, body = SessionInfo), (status = 404, body = crate::error::ErrorBody),
              (status = 422, body = crate::error::ErrorBody), (status = 429, body = crate::error::ErrorBody)),
    security(("bearer" = [])))]
async fn create_session(
    State(state): State<AppState>,
    Authed(caller): Authed,
    ApiJson(request): ApiJson<CreateSession>,
) -> HttpResult<(StatusCode, ApiJson<SessionInfo>)> {
    let info = sessions::create_session(&state, &caller, request.into()).await?;
    Ok((StatusCode::CREATED, ApiJson(info.into())))
}

/// The `metadata=K=V` pairs of a list query (parsed by hand: the parameter
/// repeats); anything else in it is refused. Keys are checked as they come, so
/// the first bad part of the query is the one reported.
fn metadata_filter(query: Option<&str>) -> HttpResult<Vec<(String, String)>> {
    let mut wanted = Vec::new();
    for (name, pair) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        if name != "metadata" {
            return Err(Error::invalid(format!(
                "unknown query parameter {name:?} (filter with metadata=KEY=VALUE)"
            ))
            .into());
        }
        let Some((key, value)) = pair.split_once('=') else {
            return Err(
                Error::invalid(format!("metadata={pair}: expected metadata=KEY=VALUE")).into(),
            );
        };
        sessions::check_metadata_key(key)?;
        wanted.push((key.to_string(), value.to_string()));
    }
    Ok(wanted)
}

#[utoipa::path(get, path = "/v1/sessions", tag = "sessions",
    params(("metadata" = Option<Vec<String>>, Query,
        description = "`KEY=VALUE`: only sessions whose metadata has it; repeat for several (all must match)")),
    responses((status = 200, body = SessionList), (status = 422, body = crate::error::ErrorBody)),
    security(("bearer" = [])))]
async fn list_sessions(
    State(state): State<AppState>,
    Authed(caller): Authed,
    RawQuery(query): RawQuery,
) -> HttpResult<ApiJson<SessionList>> {
    let wanted = metadata_filter(query.as_deref())?;
    let found = sessions::list_sessions(&state, &caller, &wanted)?;
    Ok(ApiJson(SessionList {
        sessions: found.into_iter().map(Into::into).collect(),
    }))
}

#[utoipa::path(get, path = "/v1/sessions/{id}", tag = "sessions",
    params(("id" = String, Path)),
    responses((status = 200, body = SessionInfo), (status = 404, body = crate::error::ErrorBody)),
    security(("bearer" = [])))]
async fn get_session(
    State(state): State<AppState>,
    Authed(caller): Authed,
    ApiPath(id): ApiPath<String>,
) -> HttpResult<ApiJson<SessionInfo>> {
    Ok(ApiJson(sessions::get_session(&state, &caller, &id)?.into()))
}

#[utoipa::path(patch, path = "/v1/sessions/{id}", tag = "sessions",
    params(("id" = String, Path)),
    request_body = UpdateSession,
    responses((status = 200, body = SessionInfo), (status = 404, body = crate::error::ErrorBody),
              (status = 422, body = crate::error::ErrorBody)),
    security(("bearer" = [])))]
async fn update_session(
    State(state): State<AppState>,
    Authed(caller): Authed,
    ApiPath(id): ApiPath<String>,
    ApiJson(update): ApiJson<UpdateSession>,
) -> HttpResult<ApiJson<SessionInfo>> {
    let info = sessions::update_session(&state, &caller, &id, update.into()).await?;
    Ok(ApiJson(info.into()))
}

#[utoipa::path(delete, path = "/v1/sessions/{id}", tag = "sessions",
    params(("id" = String, Path)),
    responses((status = 204), (status = 404, body = crate::error::ErrorBody)),
    security(("bearer" = [])))]
async fn delete_session(
    State(state): State<AppState>,
    Authed(caller): Authed,
    ApiPath(id): ApiPath<String>,
) -> HttpResult<StatusCode> {
    sessions::delete_session(&state, &caller, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/v1/sessions/{id}/pause", tag = "sessions",
    params(("id" = String, Path)),
    responses((status = 200, body = SessionInfo), (status = 404, body = crate::error::ErrorBody)),
    security(("bearer" = [])))]
async fn pause_session(
    State(state): State<AppState>,
    Authed(caller): Authed,
    ApiPath(id): ApiPath<String>,
) -> HttpResult<ApiJson<SessionInfo>> {
    let info = sessions::set_paused(&state, &caller, &id, true).await?;
    Ok(ApiJson(info.into()))
}

#[utoipa::path(post, path = "/v1/sessions/{id}/resume", tag = "sessions",
    params(("id" = String, Path)),
    responses((status = 200, body = SessionInfo), (status = 404, body = crate::error::ErrorBody)),
    security(("bearer" = [])))]
async fn resume_session(
    State(state): State<AppState>,
    Authed(caller): Authed,
    ApiPath(id): ApiPath<String>,
) -> HttpResult<ApiJson<SessionInfo>> {
    let info = sessions::set_paused(&state, &caller, &id, false).await?;
    Ok(ApiJson(info.into()))
}

#[utoipa::path(get, path = "/v1/sessions/{id}/stats", tag = "sessions",
    params(("id" = String, Path)),
    responses((status = 200, body = SessionStats), (status = 404, body = crate::error::ErrorBody)),
    security(("bearer" = [])))]
async fn session_stats(
    State(state): State<AppState>,
    Authed(caller): Authed,
    ApiPath(id): ApiPath<String>,
) -> HttpResult<ApiJson<SessionStats>> {
    let stats = stats::session_stats(&state, &caller, &id).await?;
    Ok(ApiJson(stats.into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A request reaches the engine as sent: the engine stores it (JSON) in the
    /// session's row, so a field lost or renamed on the way would be lost there too.
    #[test]
    fn a_create_request_reaches_the_engine_whole() {
        let sent = json!({
            "image": "python",
            "snapshot": null,
            "env": {"A": "1"},
            "limits": {"memory": "512M", "pids": 64, "cpus": 0.5, "disk": 1048576,
                       "nofile": 1024, "file_size": "1M"},
            "mounts": [{"file_id": "file_1", "path": "/data"}],
            "volume": "v",
            "volume_size": "10G",
            "files": [{"path": "a.txt", "file_id": "file_2"}],
            "ttl_seconds": 60,
            "idle_timeout_seconds": 0,
            "metadata": {"user": "u42"},
            "network": {"mode": "allow", "allow": ["example.com:443"], "deny": ["10.0.0.0/8"]},
        });
        let wire: CreateSession = serde_json::from_value(sent.clone()).unwrap();
        let engine: sessions::CreateSession = wire.into();
        assert_eq!(serde_json::to_value(&engine).unwrap(), sent);
    }

    /// Secrets reach the engine too, but no stored or printed form of the request
    /// holds a value.
    #[test]
    fn a_create_requests_secrets_reach_the_engine_and_never_print() {
        let sent = json!({
            "network": {"mode": "open"},
            "secrets": [{"name": "TOKEN", "value": "hunter2", "hosts": ["api.test"]}],
        });
        let wire: CreateSession = serde_json::from_value(sent).unwrap();
        assert!(!format!("{wire:?}").contains("hunter2"));
        let engine: sessions::CreateSession = wire.into();
        assert!(!format!("{engine:?}").contains("hunter2"));
        assert!(!serde_json::to_string(&engine).unwrap().contains("hunter2"));
        let secrets = engine.secrets.unwrap();
        assert_eq!(secrets[0].name, "TOKEN");
        assert_eq!(secrets[0].value.0, "hunter2");
        assert_eq!(secrets[0].hosts, ["api.test"]);
    }

    /// A session and its stats answer as the engine reports them.
    #[test]
    fn a_session_and_its_stats_answer_as_the_engine_has_them() {
        let info = sessions::SessionInfo {
            session_id: "ses_1".into(),
            state: "paused".into(),
            image: Some("python".into()),
            snapshot: Some("snap_1".into()),
            created_at: "2026-01-01T00:00:00Z".into(),
            expires_at: Some("2026-01-02T00:00:00Z".into()),
            idle_timeout_seconds: Some(60),
            last_active_at: "2026-01-01T00:00:01Z".into(),
            pooled: true,
            mounts: vec![sessions::BundleMount {
                file_id: "file_1".into(),
                path: "/data".into(),
            }],
            volume: Some("v".into()),
            metadata: BTreeMap::from([("user".into(), "u42".into())]),
            network: brig_engine::egress::Network {
                mode: "allow".into(),
                allow: vec!["example.com".into()],
                deny: Vec::new(),
            },
            secrets: vec![brig_engine::secrets::SecretInfo {
                name: "TOKEN".into(),
                hosts: vec!["api.test".into()],
                placeholder: "brig-secret-TOKEN-00".into(),
            }],
            limits: json!({"pids": 64}),
            enforced: json!({"seccomp": true}),
        };
        let engine = serde_json::to_value(&info).unwrap();
        assert_eq!(
            serde_json::to_value(SessionInfo::from(info)).unwrap(),
            engine
        );

        let stats = stats::SessionStats {
            session_id: "ses_1".into(),
            memory_bytes: Some(1),
            memory_peak_bytes: Some(2),
            memory_limit_bytes: Some(3),
            cpu_seconds: Some(0.5),
            cpus_limit: Some(1.5),
            tasks: Some(4),
            tasks_limit: Some(5),
            disk_used_bytes: Some(6),
            disk_limit_bytes: 7,
            volume_used_bytes: Some(8),
            volume_size_bytes: Some(9),
            oom_kills: 10,
        };
        assert_eq!(
            serde_json::to_value(SessionStats::from(stats)).unwrap(),
            json!({"session_id": "ses_1", "memory_bytes": 1, "memory_peak_bytes": 2,
                   "memory_limit_bytes": 3, "cpu_seconds": 0.5, "cpus_limit": 1.5,
                   "tasks": 4, "tasks_limit": 5, "disk_used_bytes": 6,
                   "disk_limit_bytes": 7, "volume_used_bytes": 8, "volume_size_bytes": 9,
                   "oom_kills": 10})
        );
    }
}
