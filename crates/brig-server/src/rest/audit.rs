//! `GET /v1/audit`: the audit log as a JSON page or a stream of JSON lines.

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use brig_engine::audit::{self, Format, Listing, Query};
use brig_engine::state::AppState;

use crate::http::{ApiQuery, Authed, HttpResult};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum AuditFormat {
    #[default]
    Json,
    Jsonl,
}

/// Filters of `GET /v1/audit`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// Admin only: events of this tenant (empty for requests refused without a key).
    pub tenant: Option<String>,
    pub session_id: Option<String>,
    /// e.g. `refused`, `key.create`, `file.upload`.
    pub action: Option<String>,
    /// `ok`, `error` or `refused`.
    pub outcome: Option<String>,
    /// RFC 3339; events at or after this time.
    pub since: Option<String>,
    /// RFC 3339; events before this time.
    pub until: Option<String>,
    /// At most this many events (json: default 100, at most 1000; jsonl: default all).
    pub limit: Option<u32>,
    /// Events after this id (for paging: pass the last id seen).
    pub after_id: Option<i64>,
    /// `json` (default) or `jsonl` (one event per line, streamed).
    pub format: Option<AuditFormat>,
}

impl From<AuditQuery> for Query {
    fn from(query: AuditQuery) -> Query {
        let AuditQuery {
            tenant,
            session_id,
            action,
            outcome,
            since,
            until,
            limit,
            after_id,
            format,
        } = query;
        Query {
            tenant,
            session_id,
            action,
            outcome,
            since,
            until,
            limit,
            after_id,
            format: match format.unwrap_or_default() {
                AuditFormat::Json => Format::Json,
                AuditFormat::Jsonl => Format::Jsonl,
            },
        }
    }
}

/// A stored audit event.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct AuditRow {
    pub id: i64,
    /// RFC 3339, UTC.
    pub time: String,
    /// Empty for requests refused before a tenant was known (401).
    pub tenant: String,
    pub key_id: Option<String>,
    pub session_id: Option<String>,
    pub action: String,
    #[schema(value_type = Object)]
    pub detail: serde_json::Value,
    /// `ok`, `error` or `refused`.
    pub outcome: String,
    /// The front end the event came through: `rest`, `onyx`, `e2b`, `mcp`, or
    /// `daemon` for what the daemon did on its own (expiry, a sandbox that exited).
    pub frontend: String,
}

impl From<brig_engine::db::AuditRow> for AuditRow {
    fn from(row: brig_engine::db::AuditRow) -> AuditRow {
        let brig_engine::db::AuditRow {
            id,
            time,
            tenant,
            key_id,
            session_id,
            action,
            detail,
            outcome,
            frontend,
        } = row;
        AuditRow {
            id,
            time,
            tenant,
            key_id,
            session_id,
            action,
            detail,
            outcome,
            frontend,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AuditList {
    pub events: Vec<AuditRow>,
}

/// Read the audit log (tenant: its own events; admin: all, `tenant=` to filter).
#[utoipa::path(
    get,
    path = "/v1/audit",
    tag = "audit",
    params(AuditQuery),
    responses(
        (status = 200, content(
            (AuditList = "application/json"),
            (AuditRow = "application/x-ndjson"),
        )),
        (status = 400, body = crate::error::ErrorBody),
        (status = 401, body = crate::error::ErrorBody),
        (status = 403, body = crate::error::ErrorBody),
        (status = 422, body = crate::error::ErrorBody),
    ),
    security(("bearer" = []), ("api_key" = []))
)]
async fn list_audit(
    State(state): State<AppState>,
    Authed(caller): Authed,
    ApiQuery(query): ApiQuery<AuditQuery>,
) -> HttpResult<Response> {
    Ok(match audit::query(&state, &caller, query.into()).await? {
        Listing::Page { events, transfer } => {
            let events = events.into_iter().map(AuditRow::from).collect();
            crate::http::json_holding(&AuditList { events }, transfer)
        }
        Listing::Export(pages) => jsonl(pages),
    })
}

/// The pages as JSON lines, one chunk a page.
fn jsonl(
    pages: futures_util::stream::BoxStream<
        'static,
        Result<Vec<brig_engine::db::AuditRow>, brig_engine::fault::Error>,
    >,
) -> Response {
    let chunks = pages.map(|page| match page {
        Ok(rows) => {
            let mut out = Vec::with_capacity(rows.len() * 200);
            for row in rows {
                // Serializing plain data into a Vec cannot fail.
                if serde_json::to_writer(&mut out, &AuditRow::from(row)).is_ok() {
                    out.push(b'\n');
                }
            }
            Ok(Bytes::from(out))
        }
        Err(e) => Err(std::io::Error::other(e.message)),
    });
    let mut response = Body::from_stream(chunks).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    *response.status_mut() = StatusCode::OK;
    response
}

/// `GET /v1/audit`.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(list_audit))
}
