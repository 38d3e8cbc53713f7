//! onyx python-sandbox's errors: FastAPI's `{"detail": ...}`, a string for the
//! errors its handlers raise (`HTTPException`) and a list of
//! `{type, loc, msg, input[, ctx]}` for a request that fails validation (422), with
//! the statuses onyx's server answers. onyx's clients read these, not brig's
//! `{"error": {code, message}}`.
//!
//! Each response still carries its [`ErrorCode`] as an extension, so the refusal
//! middleware counts and audits it and leaves its body alone.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use utoipa::ToSchema;

use brig_engine::auth::Caller;
use brig_engine::state::AppState;

use crate::error::{status_of, Error, ErrorCode, HttpError};
use crate::http::Authed;

/// An error as onyx's server answers it.
#[derive(Debug)]
pub struct OnyxError {
    status: StatusCode,
    code: ErrorCode,
    detail: Value,
}

pub type OnyxResult<T> = Result<T, OnyxError>;

/// FastAPI's error body (the OpenAPI document's; responses are built as JSON).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct OnyxErrorBody {
    pub detail: OnyxDetail,
}

/// A line for humans, or for a request that fails validation (422) pydantic's
/// errors.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum OnyxDetail {
    Message(String),
    Invalid(Vec<OnyxValidationError>),
}

/// One of pydantic's errors, as FastAPI lists them.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct OnyxValidationError {
    /// e.g. `missing`, `string_type`, `json_invalid`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Where: `["body", "<field>", ...]` (names and list indexes).
    pub loc: Vec<Value>,
    pub msg: String,
    /// The value that failed.
    pub input: Value,
    /// The constraint's parameters, for some errors (`{"ge": 1}`).
    pub ctx: Option<Value>,
}

impl OnyxError {
    /// An engine error with onyx's words for it instead of the engine's.
    pub fn worded(error: Error, detail: impl Into<String>) -> OnyxError {
        OnyxError {
            status: status_of(error.code),
            code: error.code,
            detail: Value::String(detail.into()),
        }
    }

    /// FastAPI's 422 for a request that does not fit its model.
    pub fn validation(errors: Vec<Value>) -> OnyxError {
        OnyxError {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            code: ErrorCode::Invalid,
            detail: Value::Array(errors),
        }
    }

    pub fn code(&self) -> ErrorCode {
        self.code
    }
}

impl From<Error> for OnyxError {
    fn from(error: Error) -> OnyxError {
        OnyxError {
            status: status_of(error.code),
            code: error.code,
            detail: Value::String(error.message),
        }
    }
}

impl From<HttpError> for OnyxError {
    fn from(error: HttpError) -> OnyxError {
        OnyxError::from(error.0)
    }
}

impl IntoResponse for OnyxError {
    fn into_response(self) -> Response {
        let mut response =
            (self.status, axum::Json(json!({ "detail": self.detail }))).into_response();
        response.extensions_mut().insert(self.code);
        response
    }
}

/// Whether `path` is one of onyx's routes, which answer errors in onyx's shape:
/// those brig serves beside its own, and everything under the `/onyx` mount
/// (`crate::onyx::mount`).
pub fn is_onyx_path(path: &str) -> bool {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match segments.as_slice() {
        ["onyx", ..] => true,
        segments => matches!(
            segments,
            ["v1", "execute"]
                | ["v1", "execute", "stream"]
                | ["v1", "files"]
                | ["v1", "files", _]
                | ["v1", "sessions", _, "bash"]
        ),
    }
}

/// 405 for a known route called with the wrong method: FastAPI's on onyx's
/// routes, brig's elsewhere. The original URI: inside the `/onyx` mount the path
/// has lost its prefix.
pub async fn method_not_allowed(
    axum::extract::OriginalUri(uri): axum::extract::OriginalUri,
) -> Response {
    if is_onyx_path(uri.path()) {
        let error = Error::new(ErrorCode::MethodNotAllowed, "Method Not Allowed");
        return OnyxError::from(error).into_response();
    }
    crate::error::method_not_allowed_fallback()
        .await
        .into_response()
}

/// [`Authed`] with its refusal (401) in onyx's shape.
pub struct OnyxAuthed(pub Caller);

impl FromRequestParts<AppState> for OnyxAuthed {
    type Rejection = OnyxError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> OnyxResult<OnyxAuthed> {
        let Authed(caller) = Authed::from_request_parts(parts, state).await?;
        Ok(OnyxAuthed(caller))
    }
}

/// A path parameter (onyx's are strings: any segment matches).
pub struct OnyxPath(pub String);

impl<S: Send + Sync> FromRequestParts<S> for OnyxPath {
    type Rejection = OnyxError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> OnyxResult<OnyxPath> {
        let crate::http::ApiPath(value) =
            crate::http::ApiPath::<String>::from_request_parts(parts, state).await?;
        Ok(OnyxPath(value))
    }
}

/// A model onyx's server reads from a JSON body, checked as pydantic checks it.
pub trait OnyxModel: Sized {
    /// The model from the body's value, or pydantic's errors (`loc` below `body`).
    fn from_body(body: &Value) -> Result<Self, Vec<Value>>;
}

/// A JSON request body read as FastAPI reads it: JSON when the content type says so
/// or says nothing; a body that is not JSON, missing or not the model is 422 with
/// FastAPI's list of errors. A body over `--max-body` is 413.
pub struct OnyxJson<T>(pub T);

impl<T: OnyxModel, S: Send + Sync> FromRequest<S> for OnyxJson<T> {
    type Rejection = OnyxError;

    async fn from_request(req: Request, state: &S) -> OnyxResult<OnyxJson<T>> {
        let is_json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| {
                let v = v.to_str().unwrap_or("").to_ascii_lowercase();
                let essence = v.split(';').next().unwrap_or("").trim().to_string();
                essence
                    .strip_prefix("application/")
                    .is_some_and(|sub| sub == "json" || sub.ends_with("+json"))
            })
            .unwrap_or(true);
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                OnyxError::from(Error::too_large(
                    "request body is over the daemon's limit (--max-body)",
                ))
            } else {
                OnyxError::from(Error::bad_request(rejection.body_text()))
            }
        })?;
        let body = parse_body(&bytes, is_json)?;
        T::from_body(&body)
            .map(OnyxJson)
            .map_err(OnyxError::validation)
    }
}

/// The body's value, as FastAPI hands it to validation.
fn parse_body(bytes: &[u8], is_json: bool) -> OnyxResult<Value> {
    if bytes.is_empty() {
        return Err(OnyxError::validation(vec![json!({
            "type": "missing", "loc": ["body"], "msg": "Field required", "input": null
        })]));
    }
    if !is_json {
        // FastAPI validates the raw bytes against the model, which no bytes fit.
        return Err(OnyxError::validation(vec![json!({
            "type": "model_attributes_type", "loc": ["body"],
            "msg": "Input should be a valid dictionary or object to extract fields from",
            "input": String::from_utf8_lossy(bytes),
        })]));
    }
    serde_json::from_slice(bytes).map_err(|e| {
        let text = String::from_utf8_lossy(bytes);
        // Python reports the character offset where decoding failed.
        let line_start: usize = text
            .split_inclusive('\n')
            .take(e.line().saturating_sub(1))
            .map(|l| l.chars().count())
            .sum();
        let pos = line_start + e.column().saturating_sub(1);
        OnyxError::validation(vec![json!({
            "type": "json_invalid", "loc": ["body", pos], "msg": "JSON decode error",
            "input": {}, "ctx": {"error": json_error_text(&e)},
        })])
    })
}

/// serde_json's reason without its position (which `loc` gives).
fn json_error_text(e: &serde_json::Error) -> String {
    let text = e.to_string();
    match text.find(" at line ") {
        Some(at) => text[..at].to_string(),
        None => text,
    }
}

/// Checks fields of a JSON object as pydantic does, collecting every error.
#[derive(Debug)]
pub struct Fields<'a> {
    object: &'a Value,
    loc: Vec<Value>,
    pub errors: Vec<Value>,
}

impl<'a> Fields<'a> {
    /// The fields of `value` at `loc` (`["body"]` for the body). `None` (with the
    /// error recorded) if it is not an object.
    pub fn of(value: &'a Value, loc: Vec<Value>, model: &str) -> Result<Fields<'a>, Value> {
        if value.is_object() {
            return Ok(Fields {
                object: value,
                loc,
                errors: Vec::new(),
            });
        }
        let (kind, msg) = if loc.len() == 1 {
            (
                "model_attributes_type",
                "Input should be a valid dictionary or object to extract fields from".to_string(),
            )
        } else {
            (
                "model_type",
                format!("Input should be a valid dictionary or instance of {model}"),
            )
        };
        Err(json!({"type": kind, "loc": loc, "msg": msg, "input": value}))
    }

    fn error(&mut self, name: &str, kind: &str, msg: &str, input: &Value, ctx: Option<Value>) {
        let mut loc = self.loc.clone();
        loc.push(Value::String(name.to_string()));
        let mut error = json!({"type": kind, "loc": loc, "msg": msg, "input": input});
        if let Some(ctx) = ctx {
            error["ctx"] = ctx;
        }
        self.errors.push(error);
    }

    /// The field's value; a missing required field is an error. A field present
    /// as `null` is `Some(Null)`.
    fn get(&mut self, name: &str, required: bool) -> Option<&'a Value> {
        let value = self.object.get(name);
        if value.is_none() && required {
            let object = self.object;
            self.error(name, "missing", "Field required", object, None);
        }
        value
    }

    /// `StrictStr` (or `StrictStr | None` when `nullable`).
    pub fn string(&mut self, name: &str, required: bool, nullable: bool) -> Option<String> {
        match self.get(name, required)? {
            Value::String(s) => Some(s.clone()),
            Value::Null if nullable => None,
            other => {
                self.error(
                    name,
                    "string_type",
                    "Input should be a valid string",
                    other,
                    None,
                );
                None
            }
        }
    }

    /// `StrictInt` with `ge=min`; a missing field is `None`.
    pub fn int_at_least(&mut self, name: &str, min: u64) -> Option<u64> {
        let value = self.get(name, false)?;
        let Value::Number(n) = value else {
            self.error(
                name,
                "int_type",
                "Input should be a valid integer",
                value,
                None,
            );
            return None;
        };
        if let Some(n) = n.as_u64().filter(|n| *n >= min) {
            return Some(n);
        }
        if n.is_f64() {
            self.error(
                name,
                "int_type",
                "Input should be a valid integer",
                value,
                None,
            );
        } else {
            let msg = format!("Input should be greater than or equal to {min}");
            self.error(
                name,
                "greater_than_equal",
                &msg,
                value,
                Some(json!({"ge": min})),
            );
        }
        None
    }

    /// `StrictInt` with `ge=min, le=max`; a missing field is `None`.
    pub fn int_between(&mut self, name: &str, min: u64, max: u64) -> Option<u64> {
        let n = self.int_at_least(name, min)?;
        if n <= max {
            return Some(n);
        }
        let value = self.object.get(name).unwrap_or(&Value::Null);
        let msg = format!("Input should be less than or equal to {max}");
        self.error(
            name,
            "less_than_equal",
            &msg,
            value,
            Some(json!({"le": max})),
        );
        None
    }

    /// `bool`, as pydantic's lax mode reads it.
    pub fn boolean(&mut self, name: &str) -> Option<bool> {
        let value = self.get(name, false)?;
        let parsed = match value {
            Value::Bool(b) => Some(*b),
            Value::Number(n) => match n.as_f64() {
                Some(0.0) => Some(false),
                Some(1.0) => Some(true),
                _ => None,
            },
            Value::String(s) => match s.to_ascii_lowercase().as_str() {
                "0" | "off" | "f" | "false" | "n" | "no" => Some(false),
                "1" | "on" | "t" | "true" | "y" | "yes" => Some(true),
                _ => None,
            },
            _ => {
                self.error(
                    name,
                    "bool_type",
                    "Input should be a valid boolean",
                    value,
                    None,
                );
                return None;
            }
        };
        if parsed.is_none() {
            let msg = "Input should be a valid boolean, unable to interpret input";
            self.error(name, "bool_parsing", msg, value, None);
        }
        parsed
    }

    /// A list of `{path, file_id}` (onyx's `ExecuteFile`); missing is empty.
    pub fn files(&mut self, name: &str) -> Vec<brig_engine::sessions::FileRef> {
        let Some(value) = self.get(name, false) else {
            return Vec::new();
        };
        let Value::Array(items) = value else {
            self.error(
                name,
                "list_type",
                "Input should be a valid list",
                value,
                None,
            );
            return Vec::new();
        };
        let mut files = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let mut loc = self.loc.clone();
            loc.extend([json!(name), json!(i)]);
            let mut fields = match Fields::of(item, loc, "ExecuteFile") {
                Ok(fields) => fields,
                Err(error) => {
                    self.errors.push(error);
                    continue;
                }
            };
            let path = fields.string("path", true, false);
            let file_id = fields.string("file_id", true, false);
            self.errors.append(&mut fields.errors);
            if let (Some(path), Some(file_id)) = (path, file_id) {
                files.push(brig_engine::sessions::FileRef { path, file_id });
            }
        }
        files
    }

    /// The model, or every error found.
    pub fn finish<T>(self, model: impl FnOnce() -> Option<T>) -> Result<T, Vec<Value>> {
        if !self.errors.is_empty() {
            return Err(self.errors);
        }
        model().ok_or_else(Vec::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn onyx_paths() {
        for path in [
            "/v1/execute",
            "/v1/execute/stream",
            "/v1/files",
            "/v1/files/abc",
            "/v1/sessions/ses_1/bash",
            "/onyx/health",
            "/onyx/v1/sessions",
            "/onyx/v1/sessions/ses_1",
            "/onyx/anything",
        ] {
            assert!(is_onyx_path(path), "{path}");
        }
        for path in [
            "/v1/sessions",
            "/v1/sessions/ses_1",
            "/v1/files/a/b",
            "/health",
            "/v1/keys",
            "/onyxes/health",
        ] {
            assert!(!is_onyx_path(path), "{path}");
        }
    }

    #[test]
    fn bodies_that_are_not_json_objects() {
        let detail = |e: OnyxError| (e.status.as_u16(), e.detail);
        let (status, d) = detail(parse_body(b"", true).unwrap_err());
        assert_eq!(status, 422);
        assert_eq!(d[0]["type"], "missing");
        assert_eq!(d[0]["loc"], json!(["body"]));
        let (_, d) = detail(parse_body(b"{\"a\":\n x}", true).unwrap_err());
        assert_eq!(d[0]["type"], "json_invalid");
        assert_eq!(d[0]["loc"], json!(["body", 7]));
        let (_, d) = detail(parse_body(b"code=1", false).unwrap_err());
        assert_eq!(d[0]["type"], "model_attributes_type");
        assert_eq!(d[0]["input"], "code=1");
    }

    #[test]
    fn fields_as_pydantic_checks_them() {
        let body = json!({"code": 5, "timeout_ms": 0, "last_line_interactive": "yes",
                          "files": [{"path": "a"}, 3], "stdin": null, "extra": 1});
        let mut f = Fields::of(&body, vec![json!("body")], "ExecuteRequest").unwrap();
        assert_eq!(f.string("code", true, false), None);
        assert_eq!(f.string("stdin", false, true), None);
        assert_eq!(f.int_at_least("timeout_ms", 1), None);
        assert_eq!(f.boolean("last_line_interactive"), Some(true));
        assert!(f.files("files").is_empty());
        let kinds: Vec<(String, Value)> = f
            .errors
            .iter()
            .map(|e| (e["type"].as_str().unwrap().to_string(), e["loc"].clone()))
            .collect();
        assert_eq!(
            kinds,
            vec![
                ("string_type".into(), json!(["body", "code"])),
                ("greater_than_equal".into(), json!(["body", "timeout_ms"])),
                ("missing".into(), json!(["body", "files", 0, "file_id"])),
                ("model_type".into(), json!(["body", "files", 1])),
            ]
        );
        assert_eq!(f.errors[1]["ctx"], json!({"ge": 1}));
        let list = json!([1]);
        let top = Fields::of(&list, vec![json!("body")], "ExecuteRequest").unwrap_err();
        assert_eq!(top["type"], "model_attributes_type");
        let odd = json!({"b": 2, "t": 1.5, "s": true});
        let mut f = Fields::of(&odd, vec![json!("body")], "M").unwrap();
        assert_eq!(f.boolean("b"), None);
        assert_eq!(f.int_at_least("t", 1), None);
        assert_eq!(f.int_at_least("s", 1), None);
        let kinds: Vec<&str> = f
            .errors
            .iter()
            .map(|e| e["type"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["bool_parsing", "int_type", "int_type"]);
        let ttl = json!({"over": 86401, "top": 86400});
        let mut f = Fields::of(&ttl, vec![json!("body")], "M").unwrap();
        assert_eq!(f.int_between("top", 1, 86400), Some(86400));
        assert_eq!(f.int_between("over", 1, 86400), None);
        assert_eq!(f.errors.len(), 1);
        assert_eq!(f.errors[0]["type"], "less_than_equal");
        assert_eq!(
            f.errors[0]["msg"],
            "Input should be less than or equal to 86400"
        );
        assert_eq!(f.errors[0]["input"], 86401);
        assert_eq!(f.errors[0]["ctx"], json!({"le": 86400}));
    }
}
