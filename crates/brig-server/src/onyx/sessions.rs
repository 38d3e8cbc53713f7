//! onyx python-sandbox's `POST /v1/sessions` and `DELETE /v1/sessions/{id}`, served
//! under the `/onyx` mount only (`crate::onyx::mount`): at the root these paths are
//! brig's own, whose session object has `expires_at` as RFC 3339 text where onyx's
//! client reads a number (see docs/API.md, "onyx python-sandbox").

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use brig_engine::fault::{Error, ErrorCode};
use brig_engine::sessions::FileRef;
use brig_engine::state::AppState;
use serde::Serialize;
use serde_json::Value;

use crate::onyx::error::{
    Fields, OnyxAuthed, OnyxError, OnyxJson, OnyxModel, OnyxPath, OnyxResult,
};

/// onyx's `DEFAULT_SESSION_TTL_SEC` and `MAX_SESSION_TTL_SEC`.
const DEFAULT_TTL_SECONDS: u64 = 15 * 60;
const MAX_TTL_SECONDS: u64 = 24 * 60 * 60;

/// onyx's `CreateSessionRequest`: unknown fields are ignored, as pydantic does.
#[derive(Debug)]
pub struct CreateSessionRequest {
    pub ttl_seconds: u64,
    pub files: Vec<FileRef>,
}

impl OnyxModel for CreateSessionRequest {
    fn from_body(body: &Value) -> Result<Self, Vec<Value>> {
        let mut fields =
            Fields::of(body, vec!["body".into()], "CreateSessionRequest").map_err(|e| vec![e])?;
        let files = fields.files("files");
        let ttl_seconds = fields.int_between("ttl_seconds", 1, MAX_TTL_SECONDS);
        fields.finish(|| {
            Some(CreateSessionRequest {
                ttl_seconds: ttl_seconds.unwrap_or(DEFAULT_TTL_SECONDS),
                files,
            })
        })
    }
}

/// onyx's `CreateSessionResponse`: `expires_at` in seconds since the epoch.
#[derive(Debug, Serialize)]
pub struct CreateSessionResponse {
    pub session_id: String,
    pub expires_at: f64,
}

pub async fn create(
    State(state): State<AppState>,
    OnyxAuthed(caller): OnyxAuthed,
    OnyxJson(request): OnyxJson<CreateSessionRequest>,
) -> OnyxResult<Response> {
    let info =
        brig_engine::execute_session::create(&state, &caller, request.ttl_seconds, request.files)
            .await?;
    let expires_at = info
        .expires_at
        .as_deref()
        .and_then(unix_seconds)
        .ok_or_else(|| Error::internal(format!("session {} has no expiry", info.session_id)))?;
    let answer = CreateSessionResponse {
        session_id: info.session_id,
        expires_at,
    };
    Ok((StatusCode::CREATED, axum::Json(answer)).into_response())
}

pub async fn delete(
    State(state): State<AppState>,
    OnyxAuthed(caller): OnyxAuthed,
    OnyxPath(id): OnyxPath,
) -> OnyxResult<StatusCode> {
    brig_engine::sessions::delete_session(&state, &caller, &id)
        .await
        .map_err(|e| match e.code {
            ErrorCode::NotFound => OnyxError::worded(e, format!("Session '{id}' not found")),
            _ => e.into(),
        })?;
    Ok(StatusCode::NO_CONTENT)
}

/// An RFC 3339 time as seconds since the epoch.
fn unix_seconds(text: &str) -> Option<f64> {
    let at =
        time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).ok()?;
    Some(at.unix_timestamp_nanos() as f64 / 1e9)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn expiry_as_onyx_reads_it() {
        assert_eq!(unix_seconds("1970-01-01T00:01:40Z"), Some(100.0));
        assert_eq!(unix_seconds("2026-01-01T00:00:00.5Z"), Some(1767225600.5));
        assert_eq!(unix_seconds("tomorrow"), None);
    }

    #[test]
    fn a_create_request_as_pydantic_reads_it() {
        let r = CreateSessionRequest::from_body(&json!({})).unwrap();
        assert_eq!((r.ttl_seconds, r.files.len()), (900, 0));
        let r = CreateSessionRequest::from_body(&json!({"ttl_seconds": 60, "extra": 1,
            "files": [{"path": "a.txt", "file_id": "f"}]}))
        .unwrap();
        assert_eq!((r.ttl_seconds, r.files[0].path.as_str()), (60, "a.txt"));
        let errors = CreateSessionRequest::from_body(&json!({"ttl_seconds": 86401})).unwrap_err();
        assert_eq!(errors[0]["type"], "less_than_equal");
        let errors = CreateSessionRequest::from_body(&json!({"ttl_seconds": "60"})).unwrap_err();
        assert_eq!(errors[0]["type"], "int_type");
    }
}
