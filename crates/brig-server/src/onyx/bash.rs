//! onyx python-sandbox's `POST /v1/sessions/{id}/bash`: a command in a live
//! session, answered in onyx's shapes.

use axum::extract::State;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use brig_engine::fault::ErrorCode;
use brig_engine::sessions::exec as engine;
use brig_engine::state::AppState;

use crate::onyx::error::{
    Fields, OnyxAuthed, OnyxError, OnyxErrorBody, OnyxJson, OnyxModel, OnyxPath, OnyxResult,
};

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(bash))
}

/// onyx's `BashExecRequest`: unknown fields are ignored, as pydantic does.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct BashRequest {
    pub cmd: String,
    /// Default 30000 (onyx's).
    #[schema(minimum = 1)]
    pub timeout_ms: Option<u64>,
}

/// onyx's default for a command in a session.
const DEFAULT_TIMEOUT_MS: u64 = 30_000;

impl OnyxModel for BashRequest {
    fn from_body(body: &Value) -> Result<Self, Vec<Value>> {
        let mut fields =
            Fields::of(body, vec!["body".into()], "BashExecRequest").map_err(|e| vec![e])?;
        let cmd = fields.string("cmd", true, false);
        let timeout_ms = fields.int_at_least("timeout_ms", 1);
        fields.finish(|| {
            Some(BashRequest {
                cmd: cmd?,
                timeout_ms: Some(timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS)),
            })
        })
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct BashResult {
    pub stdout: String,
    pub stderr: String,
    pub exit_code: Option<i32>,
    pub timed_out: bool,
    pub duration_ms: u64,
}

#[utoipa::path(post, path = "/v1/sessions/{id}/bash", tag = "execute",
    params(("id" = String, Path)), request_body = BashRequest,
    responses((status = 200, body = BashResult), (status = 404, body = OnyxErrorBody),
              (status = 422, body = OnyxErrorBody),
              (status = "default", description = "An error: `{\"detail\": ...}`", body = OnyxErrorBody)),
    security(("bearer" = [])))]
async fn bash(
    State(state): State<AppState>,
    OnyxAuthed(caller): OnyxAuthed,
    OnyxPath(id): OnyxPath,
    OnyxJson(request): OnyxJson<BashRequest>,
) -> OnyxResult<Response> {
    let (r, slot) = engine::bash(&state, &caller, &id, &request.cmd, request.timeout_ms)
        .await
        .map_err(|e| match e.code {
            ErrorCode::NotFound => OnyxError::worded(e, format!("Session '{id}' not found")),
            _ => e.into(),
        })?;
    let answer = BashResult {
        stdout: r.stdout,
        stderr: r.stderr,
        exit_code: r.exit_code,
        timed_out: r.timed_out,
        duration_ms: r.duration_ms,
    };
    Ok(crate::http::json_holding(&answer, slot))
}
