//! `/v1/keys` and `/v1/tenants`: API keys, and tenants with their quotas and usage.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use brig_engine::auth;
use brig_engine::db::{KeyRow, QuotaUpdate};
use brig_engine::state::AppState;

use crate::http::{AdminCaller, ApiJson, ApiPath, Authed, HttpResult};

/// `POST /v1/keys`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateKeyRequest {
    /// The tenant the key belongs to; created if new.
    pub tenant: String,
    /// A label for humans.
    #[serde(default)]
    pub name: Option<String>,
}

/// A new key: `key` is shown this once.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CreatedKey {
    pub key_id: String,
    pub key: String,
    pub tenant: String,
    pub name: Option<String>,
    pub created_at: String,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct KeyInfo {
    pub key_id: String,
    pub tenant: String,
    pub name: Option<String>,
    pub created_at: String,
    pub revoked_at: Option<String>,
}

impl From<KeyRow> for KeyInfo {
    fn from(row: KeyRow) -> KeyInfo {
        let KeyRow {
            id,
            tenant,
            name,
            created_at,
            revoked_at,
        } = row;
        KeyInfo {
            key_id: id,
            tenant,
            name,
            created_at,
            revoked_at,
        }
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct KeyList {
    pub keys: Vec<KeyInfo>,
}

/// What a tenant uses now.
#[derive(Debug, Serialize, ToSchema)]
pub struct Usage {
    /// Live sessions.
    pub sessions: u64,
    /// Execs running now.
    pub concurrent_execs: u64,
    /// Bytes of stored files (`/v1/files`).
    pub file_bytes: u64,
    /// The capacity of its volumes (`/v1/volumes`).
    pub volume_bytes: u64,
    /// The layers its snapshots hold (`/v1/snapshots`), each once.
    pub snapshot_bytes: u64,
    /// The `disk` limits of its live sessions: reserved whether written or not.
    pub session_disk_bytes: u64,
    /// What counts against `max_disk_bytes`: the four byte counts above together.
    pub disk_bytes: u64,
}

impl From<auth::Usage> for Usage {
    fn from(usage: auth::Usage) -> Usage {
        let auth::Usage {
            sessions,
            concurrent_execs,
            file_bytes,
            volume_bytes,
            snapshot_bytes,
            session_disk_bytes,
            disk_bytes,
        } = usage;
        Usage {
            sessions,
            concurrent_execs,
            file_bytes,
            volume_bytes,
            snapshot_bytes,
            session_disk_bytes,
            disk_bytes,
        }
    }
}

/// Effective quotas of a tenant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ToSchema)]
pub struct Quotas {
    pub max_sessions: u64,
    pub max_concurrent_execs: u64,
    /// Counts the disk limit of each live session plus stored files.
    pub max_disk_bytes: u64,
}

impl From<auth::Quotas> for Quotas {
    fn from(quotas: auth::Quotas) -> Quotas {
        let auth::Quotas {
            max_sessions,
            max_concurrent_execs,
            max_disk_bytes,
        } = quotas;
        Quotas {
            max_sessions,
            max_concurrent_execs,
            max_disk_bytes,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TenantInfo {
    pub tenant: String,
    pub created_at: String,
    pub quotas: Quotas,
    /// The bound on its sessions' network policies: a session may ask for this mode
    /// or a narrower one, and a connection goes out only if both the session's
    /// policy and this bound allow it. `null`: no bound but the daemon's.
    pub network_bound: Option<super::sessions::Network>,
    pub usage: Usage,
}

impl From<auth::TenantInfo> for TenantInfo {
    fn from(info: auth::TenantInfo) -> TenantInfo {
        let auth::TenantInfo {
            tenant,
            created_at,
            quotas,
            network_bound,
            usage,
        } = info;
        TenantInfo {
            tenant,
            created_at,
            quotas: quotas.into(),
            network_bound: network_bound.map(Into::into),
            usage: usage.into(),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TenantList {
    pub tenants: Vec<TenantInfo>,
}

/// `PUT /v1/tenants/{tenant}/quotas`: an absent field is left alone, `null` resets
/// the quota to the daemon's default, a value sets it.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QuotaRequest {
    #[serde(default, deserialize_with = "some")]
    #[schema(value_type = Option<u64>)]
    pub max_sessions: Option<Option<u64>>,
    #[serde(default, deserialize_with = "some")]
    #[schema(value_type = Option<u64>)]
    pub max_concurrent_execs: Option<Option<u64>>,
    #[serde(default, deserialize_with = "some")]
    #[schema(value_type = Option<ByteSize>)]
    pub max_disk_bytes: Option<Option<ByteSize>>,
    /// The bound on the tenant's sessions' network policies (see `TenantInfo`);
    /// `null` removes it. Live sessions decide new connections under it at once.
    #[serde(default, deserialize_with = "some")]
    #[schema(value_type = Option<super::sessions::Network>)]
    pub network_bound: Option<Option<super::sessions::Network>>,
}

impl From<QuotaRequest> for QuotaUpdate {
    fn from(request: QuotaRequest) -> QuotaUpdate {
        let QuotaRequest {
            max_sessions,
            max_concurrent_execs,
            max_disk_bytes,
            network_bound,
        } = request;
        QuotaUpdate {
            max_sessions,
            max_concurrent_execs,
            max_disk_bytes: max_disk_bytes.map(|size| size.map(|s| s.0)),
            // Checked (and made canonical) by the engine.
            network_bound: network_bound.map(|bound| {
                bound.map(|network| serde_json::to_string(&network).unwrap_or_default())
            }),
        }
    }
}

/// A present field (even `null`) is `Some`; with `#[serde(default)]` an absent one is `None`.
fn some<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(deserializer).map(Some)
}

/// A size in a JSON request: an integer (bytes) or a string like `"512M"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteSize(pub u64);

impl<'de> serde::Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = ByteSize;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a size in bytes or a string like \"512M\"")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom(format!("invalid size {v}: must not be negative")))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ByteSize, E> {
                brig_policy::parse_size(v).map(ByteSize).map_err(E::custom)
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

impl serde::Serialize for ByteSize {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(self.0)
    }
}

impl utoipa::PartialSchema for ByteSize {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Type};
        OneOfBuilder::new()
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::Integer)
                    .minimum(Some(0)),
            )
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .examples(["512M"]),
            )
            .description(Some("bytes, or a binary size such as \"512M\" or \"10G\""))
            .into()
    }
}

impl utoipa::ToSchema for ByteSize {}

/// Create an API key (admin).
#[utoipa::path(
    post,
    path = "/v1/keys",
    tag = "tenants",
    request_body = CreateKeyRequest,
    responses(
        (status = 201, description = "The key (shown once)", body = CreatedKey),
        (status = 401, body = crate::error::ErrorBody),
        (status = 403, body = crate::error::ErrorBody),
        (status = 422, body = crate::error::ErrorBody),
    ),
    security(("bearer" = []), ("api_key" = []))
)]
async fn create_key(
    State(state): State<AppState>,
    AdminCaller(caller): AdminCaller,
    ApiJson(request): ApiJson<CreateKeyRequest>,
) -> HttpResult<impl IntoResponse> {
    let CreateKeyRequest { tenant, name } = request;
    let (key, row) = auth::create_key(&state, &caller, &tenant, name).await?;
    let KeyRow {
        id,
        tenant,
        name,
        created_at,
        revoked_at: _,
    } = row;
    let created = CreatedKey {
        key_id: id,
        key,
        tenant,
        name,
        created_at,
    };
    Ok((StatusCode::CREATED, ApiJson(created)))
}

/// List keys (admin: all tenants; tenant: its own). Keys themselves are never shown.
#[utoipa::path(
    get,
    path = "/v1/keys",
    tag = "tenants",
    responses(
        (status = 200, body = KeyList),
        (status = 401, body = crate::error::ErrorBody),
    ),
    security(("bearer" = []), ("api_key" = []))
)]
async fn list_keys(
    State(state): State<AppState>,
    Authed(caller): Authed,
) -> HttpResult<ApiJson<KeyList>> {
    let keys = auth::list_keys(&state, &caller).await?;
    Ok(ApiJson(KeyList {
        keys: keys.into_iter().map(KeyInfo::from).collect(),
    }))
}

/// Revoke a key (admin). Takes effect at once.
#[utoipa::path(
    delete,
    path = "/v1/keys/{key_id}",
    tag = "tenants",
    params(("key_id" = String, Path, description = "e.g. key_0a1b2c3d")),
    responses(
        (status = 204, description = "Revoked"),
        (status = 401, body = crate::error::ErrorBody),
        (status = 403, body = crate::error::ErrorBody),
        (status = 404, body = crate::error::ErrorBody),
    ),
    security(("bearer" = []), ("api_key" = []))
)]
async fn delete_key(
    State(state): State<AppState>,
    AdminCaller(caller): AdminCaller,
    ApiPath(key_id): ApiPath<String>,
) -> HttpResult<StatusCode> {
    auth::revoke_key(&state, &caller, &key_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// List tenants with their quotas and usage (admin).
#[utoipa::path(
    get,
    path = "/v1/tenants",
    tag = "tenants",
    responses(
        (status = 200, body = TenantList),
        (status = 401, body = crate::error::ErrorBody),
        (status = 403, body = crate::error::ErrorBody),
    ),
    security(("bearer" = []), ("api_key" = []))
)]
async fn list_tenants(
    State(state): State<AppState>,
    AdminCaller(caller): AdminCaller,
) -> HttpResult<ApiJson<TenantList>> {
    let tenants = auth::list_tenants(&state, &caller).await?;
    Ok(ApiJson(TenantList {
        tenants: tenants.into_iter().map(TenantInfo::from).collect(),
    }))
}

/// One tenant's quotas and usage: any tenant for an administrator, otherwise the
/// caller's own (another tenant's name answers 404, as an unknown one).
#[utoipa::path(
    get,
    path = "/v1/tenants/{tenant}",
    tag = "tenants",
    params(("tenant" = String, Path)),
    responses(
        (status = 200, body = TenantInfo),
        (status = 401, body = crate::error::ErrorBody),
        (status = 404, body = crate::error::ErrorBody),
    ),
    security(("bearer" = []), ("api_key" = []))
)]
async fn get_tenant(
    State(state): State<AppState>,
    Authed(caller): Authed,
    ApiPath(tenant): ApiPath<String>,
) -> HttpResult<ApiJson<TenantInfo>> {
    let info = auth::tenant(&state, &caller, &tenant).await?;
    Ok(ApiJson(info.into()))
}

/// Set a tenant's quotas (admin).
#[utoipa::path(
    put,
    path = "/v1/tenants/{tenant}/quotas",
    tag = "tenants",
    params(("tenant" = String, Path)),
    request_body = QuotaRequest,
    responses(
        (status = 200, body = TenantInfo),
        (status = 401, body = crate::error::ErrorBody),
        (status = 403, body = crate::error::ErrorBody),
        (status = 404, body = crate::error::ErrorBody),
        (status = 422, body = crate::error::ErrorBody),
    ),
    security(("bearer" = []), ("api_key" = []))
)]
async fn put_quotas(
    State(state): State<AppState>,
    AdminCaller(caller): AdminCaller,
    ApiPath(tenant): ApiPath<String>,
    ApiJson(request): ApiJson<QuotaRequest>,
) -> HttpResult<ApiJson<TenantInfo>> {
    let info = auth::set_quotas(&state, &caller, &tenant, request.into()).await?;
    Ok(ApiJson(info.into()))
}

/// `/v1/keys` and `/v1/tenants`.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_key, list_keys))
        .routes(routes!(delete_key))
        .routes(routes!(list_tenants))
        .routes(routes!(get_tenant))
        .routes(routes!(put_quotas))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_in_json() {
        let parse = |text: &str| serde_json::from_str::<ByteSize>(text).map(|s| s.0);
        assert_eq!(parse("1024").unwrap(), 1024);
        assert_eq!(parse("\"512M\"").unwrap(), 512 << 20);
        for bad in ["-1", "\"12Q\"", "1.5", "null", "[]"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
