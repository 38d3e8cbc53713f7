//! The audit log: who did what, when, with which outcome.
//!
//! Verbs call [`record`] for every state change (session lifecycle, exec, file
//! operation, key and quota changes). Requests refused with 401/403/404/413/422/429
//! are recorded by the server's refusal middleware through [`record_refusal`] as
//! action `refused`; a 401 has no tenant yet and is recorded under tenant `""`,
//! which only an admin sees. [`query`] reads the log back.
//!
//! Outcomes are `ok`, `error` (the action was attempted and failed) and `refused`.

use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::BoxStream;
use serde_json::Value;

use crate::auth::{Caller, Permit};
use crate::catalog::Catalog;
use crate::db::{now_rfc3339, parse_rfc3339, rfc3339_before, AuditFilter, AuditRow, NewAuditEvent};
use crate::fault::Error as ApiError;
use crate::state::{AppState, Shared};

/// Longest string kept in an event's detail (commands, code, paths).
pub const MAX_DETAIL_STRING: usize = 1024;
/// Most items kept of an array or object in an event's detail.
pub const MAX_DETAIL_ITEMS: usize = 100;
/// The most an event's detail takes stored, as JSON (where a control byte takes
/// six): a refused request with a hundred long arguments would otherwise add ~600
/// KiB to the log, kept for its retention and counted in no quota.
pub const MAX_DETAIL_BYTES: usize = 4096;
/// Longest method kept of a request in its refusal's event and its log line, and
/// longest path (see [`bounded`]): any token is a method to HTTP, and one of 1,100
/// characters with a path of 1 KiB, answered 405 before any key is looked at, made
/// 2 KiB of audit and 6 KiB of log a request.
pub const MAX_RECORDED_METHOD: usize = 16;
pub const MAX_RECORDED_PATH: usize = 256;

/// `text` as is up to `max` bytes; past that its first `max` bytes (at a character
/// boundary) followed by `… (N bytes)`, so the record still says it was long.
pub fn bounded(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= max {
        return text.into();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &text[..end], text.len()).into()
}

/// Events of a [`Format::Json`] answer without a `limit`, and the most with one.
pub const DEFAULT_LIMIT: u32 = 100;
pub const MAX_LIMIT: u32 = 1000;
/// Rows read per database round trip while streaming JSON lines.
const STREAM_PAGE: u32 = 500;

/// Appends an event. Never fails the request: a database error is logged.
/// Strings in `detail` are cut to 1 KiB, arrays and objects to 100 items.
pub async fn record(
    state: &Shared,
    caller: &Caller,
    session_id: Option<&str>,
    action: &str,
    detail: Value,
    outcome: &str,
) {
    // A refused attempt (its outcome the error code of a 4xx or 503) is a refusal to
    // the budget: a tenant could otherwise write an exec's 4 KiB detail for each of
    // thousands of requests a second that find no session. What ran (an exec that
    // timed out, was OOM-killed or lost its client) is always recorded.
    let refusal = REFUSAL_CODES.contains(&outcome);
    if refusal
        && !state
            .refusals
            .admit(&caller.tenant, outcome, std::time::Instant::now())
    {
        return;
    }
    record_in(&*state.db, caller, session_id, action, detail, outcome).await;
}

/// [`record`] for what the daemon does on its own (expiry, a sandbox that exited):
/// the event belongs to `tenant`, with no key.
pub async fn record_system(
    state: &Shared,
    tenant: &str,
    session_id: Option<&str>,
    action: &str,
    detail: Value,
    outcome: &str,
) {
    let owner = Caller {
        tenant: tenant.to_string(),
        key_id: None,
        admin: false,
        frontend: crate::auth::Frontend::Daemon,
    };
    record_in(&*state.db, &owner, session_id, action, detail, outcome).await;
}

/// [`record`] with only a database (for background tasks holding no state).
pub async fn record_in(
    db: &dyn Catalog,
    caller: &Caller,
    session_id: Option<&str>,
    action: &str,
    detail: Value,
    outcome: &str,
) {
    let event = event(caller, session_id, action, detail, outcome);
    if let Err(e) = db.insert_audit(event).await {
        tracing::error!(action, tenant = %caller.tenant, error = %e, "cannot write an audit event");
    }
}

/// The outcomes of refused requests, whose events draw on the [`RefusalBudget`]:
/// the error codes the daemon answers with a 4xx or a 503 (a test in the server's
/// refusal middleware holds this to the statuses of the codes).
pub const REFUSAL_CODES: &[&str] = &[
    "bad_request",
    "unauthorized",
    "forbidden",
    "not_found",
    "no_such_file",
    "method_not_allowed",
    "conflict",
    "gone",
    "payload_too_large",
    "invalid_request",
    "quota_exceeded",
    "unavailable",
    "request_timeout",
    "uri_too_long",
    "headers_too_large",
    "not_a_directory",
    "not_a_file",
    "already_exists",
    "not_empty",
    "invalid_path",
    "path_escapes",
    "busy",
    "permission_denied",
    "read_only",
    "invalid_archive",
];

/// Refusals recorded one by one, per tenant (requests without a valid key share
/// one budget, under tenant `""`): a refusal costs its client next to nothing, and
/// each is a database write kept for the retention. 4,200 requests a second with
/// no key grew the database by 6 MB/s (500 GB a day) before. Past the budget,
/// refusals are counted, and the count goes in one summary event a second.
/// (A token bucket written out rather than a rate-limiter crate: what matters here
/// is what was left out, which lives with the bucket.)
const REFUSALS_PER_SECOND: f64 = 20.0;
/// Refusals recorded one by one after a quiet spell, before the rate holds.
const REFUSAL_BURST: f64 = 100.0;
/// The same for requests without a valid key, all clients together: anyone who can
/// reach the port makes them, and at the tenants' rate they could write ~1.7 GB a
/// day for the retention to keep (30 days: 50 GB). At this one, with the summaries,
/// ~150 MB a day.
const KEYLESS_REFUSALS_PER_SECOND: f64 = 2.0;
const KEYLESS_REFUSAL_BURST: f64 = 20.0;

/// (rate, burst) of `tenant`'s budget: `""` is every request without a valid key.
fn refusal_budget(tenant: &str) -> (f64, f64) {
    if tenant.is_empty() {
        (KEYLESS_REFUSALS_PER_SECOND, KEYLESS_REFUSAL_BURST)
    } else {
        (REFUSALS_PER_SECOND, REFUSAL_BURST)
    }
}
/// How often the summaries of refusals left out are written.
pub const REFUSAL_SUMMARY_INTERVAL: Duration = Duration::from_secs(1);

/// Each tenant's budget of refusals recorded one by one; see [`REFUSALS_PER_SECOND`].
#[derive(Default)]
pub struct RefusalBudget {
    tenants: std::sync::Mutex<std::collections::HashMap<String, RefusalBucket>>,
}

struct RefusalBucket {
    tokens: f64,
    refilled: std::time::Instant,
    /// Refusals not recorded one by one since the last summary, by error code.
    left_out: std::collections::BTreeMap<String, u64>,
    first_left_out: String,
    last_left_out: String,
}

impl RefusalBudget {
    /// Whether a refusal of `tenant` is recorded on its own; if not, it is counted
    /// in the tenant's next summary.
    pub fn admit(&self, tenant: &str, code: &str, now: std::time::Instant) -> bool {
        let mut tenants = self.tenants.lock().unwrap_or_else(|e| e.into_inner());
        // Tenants are those of valid keys, plus `""`: the map stays small, and
        // `take_summaries` forgets those whose budget is full again.
        let (rate, burst) = refusal_budget(tenant);
        let bucket = tenants
            .entry(tenant.to_string())
            .or_insert_with(|| RefusalBucket {
                tokens: burst,
                refilled: now,
                left_out: Default::default(),
                first_left_out: String::new(),
                last_left_out: String::new(),
            });
        let elapsed = now.saturating_duration_since(bucket.refilled).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * rate).min(burst);
        bucket.refilled = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return true;
        }
        let time = now_rfc3339();
        if bucket.left_out.is_empty() {
            bucket.first_left_out = time.clone();
        }
        bucket.last_left_out = time;
        match bucket.left_out.get_mut(code) {
            Some(count) => *count += 1,
            None => {
                bucket.left_out.insert(code.to_string(), 1);
            }
        }
        false
    }

    /// The tenants with refusals left out since the last call, each with the detail
    /// of its summary event; tenants whose budget is full again are forgotten.
    pub fn take_summaries(&self, now: std::time::Instant) -> Vec<(String, Value)> {
        let mut tenants = self.tenants.lock().unwrap_or_else(|e| e.into_inner());
        let mut summaries = Vec::new();
        tenants.retain(|tenant, bucket| {
            if !bucket.left_out.is_empty() {
                let codes = std::mem::take(&mut bucket.left_out);
                summaries.push((
                    tenant.clone(),
                    serde_json::json!({
                        "left_out": codes.values().sum::<u64>(),
                        "codes": codes,
                        "first": bucket.first_left_out,
                        "last": bucket.last_left_out,
                    }),
                ));
            }
            let (rate, burst) = refusal_budget(tenant);
            let elapsed = now.saturating_duration_since(bucket.refilled).as_secs_f64();
            bucket.tokens + elapsed * rate < burst
        });
        summaries
    }
}

/// Writes the summaries of refusals left out of the log (see [`RefusalBudget`])
/// every [`REFUSAL_SUMMARY_INTERVAL`].
pub fn spawn_refusal_summaries(state: &AppState) {
    crate::state::spawn_periodic(state, REFUSAL_SUMMARY_INTERVAL, |state| async move {
        write_refusal_summaries(&state).await;
    });
}

/// Writes one `refused` event per tenant with refusals left out: detail
/// `{left_out, codes: {code: n}, first, last}`.
pub async fn write_refusal_summaries(state: &Shared) {
    for (tenant, detail) in state.refusals.take_summaries(std::time::Instant::now()) {
        record_system(state, &tenant, None, "refused", detail, "refused").await;
    }
}

/// Events removed per transaction by the retention task, which holds the write lock
/// that requests share meanwhile. Measured with a backlog of 1M events: batches of
/// 500 (~40k events/s) raised a steady exec's p99 from 2.4-2.9 to 5.6 ms; batches of
/// 100 (~8k events/s, 29M an hour) left it within the noise.
const PRUNE_BATCH: u32 = 100;
/// Pause between two batches, so the requests' writes get the lock in between.
const PRUNE_PAUSE: Duration = Duration::from_millis(10);

/// Removes audit events older than `--audit-retention` (unless it is 0), at start
/// and then twice per retention period (at most hourly, at least every second):
/// the log grows with every request, and the daemon runs for months.
pub fn spawn_retention(state: &AppState) {
    let retention = Duration::from_millis(state.args.audit_retention_ms);
    if retention.is_zero() {
        return;
    }
    let interval = (retention / 2).clamp(Duration::from_secs(1), Duration::from_secs(3600));
    crate::state::spawn_periodic(state, interval, move |state| async move {
        match prune(&*state.db, retention).await {
            Ok(0) => {}
            Ok(removed) => tracing::info!(
                removed,
                retention_ms = state.args.audit_retention_ms,
                "removed audit events past their retention"
            ),
            Err(e) => tracing::warn!(error = %e, "audit retention failed; retrying later"),
        }
    });
}

/// Removes the events older than `retention`, a batch at a time; returns how many.
pub async fn prune(db: &dyn Catalog, retention: Duration) -> Result<usize, ApiError> {
    let cutoff = rfc3339_before(retention);
    let mut removed = 0;
    loop {
        // A batch that removes nothing ends it: no event is that old.
        let batch = db.prune_audit(cutoff.clone(), PRUNE_BATCH).await?;
        removed += batch;
        if batch == 0 {
            return Ok(removed);
        }
        tokio::time::sleep(PRUNE_PAUSE).await;
    }
}

/// An event as [`record`] stores it, for writing in a transaction of the caller's
/// own (see [`Catalog::insert_session`]).
pub fn event(
    caller: &Caller,
    session_id: Option<&str>,
    action: &str,
    detail: Value,
    outcome: &str,
) -> NewAuditEvent {
    NewAuditEvent {
        time: now_rfc3339(),
        tenant: caller.tenant.clone(),
        key_id: caller.key_id.clone(),
        frontend: caller.frontend.as_str(),
        // Ids are short: a longer one is a client's invention.
        session_id: session_id.map(|s| truncate_str(s, 128).into_owned()),
        action: truncate_str(action, MAX_DETAIL_STRING).into_owned(),
        detail: truncate_detail(detail),
        outcome: truncate_str(outcome, MAX_DETAIL_STRING).into_owned(),
    }
}

fn truncate_str(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= max {
        return text.into();
    }
    const MARK: &str = "…";
    let mut end = max.saturating_sub(MARK.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{MARK}", &text[..end]).into()
}

/// The audit outcome of a request's result: "ok", or the error's stable code.
pub fn outcome<T>(result: &Result<T, crate::fault::Error>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(e) => e.code.as_str(),
    }
}

/// Bounds a detail value: every string at most 1 KiB (cut at a character boundary,
/// ending with `…`), every array and object at most 100 items (an array gets a last
/// string item `… N more`, an object a `"…"` key with the count left out), and the
/// whole at most [`MAX_DETAIL_BYTES`] as stored: past that, strings and lists are
/// cut shorter until it fits.
pub fn truncate_detail(value: Value) -> Value {
    let encoded = |value: &Value| serde_json::to_vec(value).map_or(usize::MAX, |v| v.len());
    let (mut string, mut items) = (MAX_DETAIL_STRING, MAX_DETAIL_ITEMS);
    let mut value = cut_detail(value, string, items);
    loop {
        let size = encoded(&value);
        if size <= MAX_DETAIL_BYTES {
            return value;
        }
        if string <= 16 && items <= 1 {
            return Value::String(format!("… (a detail of {size} bytes, left out)"));
        }
        (string, items) = ((string / 2).max(16), (items / 2).max(1));
        value = cut_detail(value, string, items);
    }
}

fn cut_detail(value: Value, string: usize, items: usize) -> Value {
    match value {
        Value::String(s) => match truncate_str(&s, string) {
            std::borrow::Cow::Borrowed(_) => Value::String(s),
            std::borrow::Cow::Owned(cut) => Value::String(cut),
        },
        Value::Array(list) => {
            let total = list.len();
            let mut kept: Vec<Value> = list
                .into_iter()
                .take(items)
                .map(|v| cut_detail(v, string, items))
                .collect();
            if total > items {
                kept.push(Value::String(format!("… {} more", total - items)));
            }
            Value::Array(kept)
        }
        Value::Object(map) => {
            let total = map.len();
            let mut kept: serde_json::Map<String, Value> = map
                .into_iter()
                .take(items)
                .map(|(k, v)| {
                    let key = truncate_str(&k, string).into_owned();
                    (key, cut_detail(v, string, items))
                })
                .collect();
            if total > items {
                kept.insert("…".to_string(), Value::from(total - items));
            }
            Value::Object(kept)
        }
        other => other,
    }
}

/// Records a request refused with `status` and error `code` (a 4xx or a 503), under
/// the tenant of `caller` (`""` when no key was accepted), unless the tenant's
/// refusal budget is spent: then it is only counted in the next summary. `method`
/// and `path` come cut by [`bounded`] to [`MAX_RECORDED_METHOD`] and
/// [`MAX_RECORDED_PATH`] (the front end holds them while the request runs).
pub async fn record_refusal(
    state: &Shared,
    caller: Option<&Caller>,
    method: &str,
    path: &str,
    status: u16,
    code: &str,
) {
    let keyless;
    let caller = match caller {
        Some(caller) => caller,
        None => {
            keyless = Caller {
                tenant: String::new(),
                key_id: None,
                admin: false,
                frontend: crate::auth::Frontend::Rest,
            };
            &keyless
        }
    };
    if !state
        .refusals
        .admit(&caller.tenant, code, std::time::Instant::now())
    {
        return;
    }
    let detail = serde_json::json!({
        "method": method,
        "path": path,
        "status": status,
        "code": code,
    });
    record_in(&*state.db, caller, None, "refused", detail, "refused").await;
}

// ---------------------------------------------------------------------------------
// Reading the log

/// How [`query`] answers: a page, or every event as a stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Format {
    /// At most [`MAX_LIMIT`] events at once (default [`DEFAULT_LIMIT`]).
    #[default]
    Json,
    /// Every event that matches (or `limit`), a page at a time.
    Jsonl,
}

/// What [`query`] looks for. Times are RFC 3339 as given by the client.
#[derive(Debug, Clone, Default)]
pub struct Query {
    /// Admin only: events of this tenant (`""`: requests refused without a key).
    pub tenant: Option<String>,
    pub session_id: Option<String>,
    pub action: Option<String>,
    pub outcome: Option<String>,
    pub since: Option<String>,
    pub until: Option<String>,
    pub limit: Option<u32>,
    pub after_id: Option<i64>,
    pub format: Format,
}

/// What [`query`] found.
pub enum Listing {
    /// [`Format::Json`]: one page. Up to 1,000 events (a few MB): the answer counts
    /// as a transfer until the client has read it, so the permit goes with it.
    Page {
        events: Vec<AuditRow>,
        transfer: Permit,
    },
    /// [`Format::Jsonl`]: pages of events until the end, holding the transfer permit
    /// for as long as the stream lives.
    Export(BoxStream<'static, Result<Vec<AuditRow>, ApiError>>),
}

/// Reads the audit log: a tenant its own events (another tenant's is 403), an
/// administrator every tenant's, or one tenant's with `tenant`.
pub async fn query(state: &Shared, caller: &Caller, query: Query) -> Result<Listing, ApiError> {
    let tenant = match (caller.admin, query.tenant) {
        (true, tenant) => tenant,
        (false, Some(t)) if t != caller.tenant => {
            return Err(ApiError::forbidden(
                "only an admin may read other tenants' events",
            ));
        }
        (false, _) => Some(caller.tenant.clone()),
    };
    let time = |field: &str, value: Option<String>| match value {
        None => Ok(None),
        Some(text) => parse_rfc3339(&text).map(Some).ok_or_else(|| {
            ApiError::invalid(format!(
                "{field} must be an RFC 3339 time such as 2025-01-31T12:00:00Z"
            ))
        }),
    };
    let limit = match (query.format, query.limit) {
        (_, Some(0)) => return Err(ApiError::invalid("limit must be at least 1")),
        (Format::Json, Some(n)) if n > MAX_LIMIT => {
            return Err(ApiError::invalid(format!(
                "limit must be at most {MAX_LIMIT} (use format=jsonl for more)"
            )));
        }
        (Format::Json, n) => n.unwrap_or(DEFAULT_LIMIT),
        (Format::Jsonl, n) => n.unwrap_or(u32::MAX),
    };
    let filter = AuditFilter {
        tenant,
        session_id: query.session_id,
        action: query.action,
        outcome: query.outcome,
        since: time("since", query.since)?,
        until: time("until", query.until)?,
        after_id: query.after_id,
        max_id: None,
        limit,
    };
    let transfer = state.auth.transfer_permit(&caller.tenant)?;
    match query.format {
        Format::Json => {
            let events = state.db.audit_events(filter).await?;
            Ok(Listing::Page { events, transfer })
        }
        Format::Jsonl => Ok(Listing::Export(
            export(state.db.clone(), filter, transfer).await?,
        )),
    }
}

/// The events a page at a time. Events appended while the stream runs are left out
/// (the stream stops at the newest id when it started), so it always ends; after an
/// error it ends too.
async fn export(
    db: Arc<dyn Catalog>,
    mut filter: AuditFilter,
    transfer: Permit,
) -> Result<BoxStream<'static, Result<Vec<AuditRow>, ApiError>>, ApiError> {
    filter.max_id = Some(db.max_audit_id().await?);
    let remaining = filter.limit;
    let stream = futures_util::stream::unfold(
        (db, filter, remaining, false, transfer),
        |(db, mut filter, remaining, done, transfer)| async move {
            if done || remaining == 0 {
                return None;
            }
            filter.limit = remaining.min(STREAM_PAGE);
            match db.audit_events(filter.clone()).await {
                Ok(rows) => {
                    let last_page = (rows.len() as u32) < filter.limit;
                    filter.after_id = Some(rows.last()?.id);
                    let remaining = remaining - rows.len() as u32;
                    Some((Ok(rows), (db, filter, remaining, last_page, transfer)))
                }
                Err(e) => Some((Err(e), (db, filter, remaining, true, transfer))),
            }
        },
    );
    Ok(Box::pin(stream))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::{rfc3339_after, Db};
    use std::time::Instant;

    #[test]
    fn refusals_past_the_budget_are_summed_up_per_tenant() {
        let budget = RefusalBudget::default();
        let start = Instant::now();
        let admitted = (0..250)
            .filter(|i| {
                let code = if i % 2 == 0 {
                    "not_found"
                } else {
                    "unauthorized"
                };
                budget.admit("", code, start)
            })
            .count();
        assert_eq!(admitted, KEYLESS_REFUSAL_BURST as usize);
        // Another tenant has its own budget, a larger one.
        let admitted = (0..250)
            .filter(|_| budget.admit("b", "not_found", start))
            .count();
        assert_eq!(admitted, REFUSAL_BURST as usize);
        let mut summaries = budget.take_summaries(start);
        summaries.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(summaries.len(), 2, "{summaries:?}");
        let (tenant, detail) = &summaries[0];
        assert_eq!(tenant, "");
        assert_eq!(detail["left_out"], 230);
        assert_eq!(detail["codes"]["not_found"], 115);
        assert_eq!(detail["codes"]["unauthorized"], 115);
        assert_eq!(summaries[1].1["left_out"], 150);
        assert!(detail["first"].as_str().unwrap() <= detail["last"].as_str().unwrap());
        // Nothing left out since: no summary. The budget refills at its rate.
        assert!(budget.take_summaries(start).is_empty());
        let later = start + Duration::from_millis(500);
        let admitted = (0..50).filter(|_| budget.admit("b", "x", later)).count();
        assert_eq!(admitted, (REFUSALS_PER_SECOND / 2.0) as usize);
        assert_eq!(budget.take_summaries(later)[0].1["left_out"], 40);
        let admitted = (0..50).filter(|_| budget.admit("", "x", later)).count();
        assert_eq!(admitted, (KEYLESS_REFUSALS_PER_SECOND / 2.0) as usize);
        assert_eq!(budget.take_summaries(later)[0].1["left_out"], 49);
        // Full again: forgotten.
        let much_later = later + Duration::from_secs(60);
        assert!(budget.take_summaries(much_later).is_empty());
        assert!(budget.tenants.lock().unwrap().is_empty());
    }

    fn event_at(time: &str, n: usize) -> NewAuditEvent {
        NewAuditEvent {
            time: time.to_string(),
            tenant: "t".into(),
            key_id: None,
            frontend: "rest",
            session_id: None,
            action: format!("a{n}"),
            detail: Value::Null,
            outcome: "ok".into(),
        }
    }

    async fn actions(db: &dyn Catalog) -> Vec<String> {
        db.audit_events(AuditFilter {
            limit: 10_000,
            ..AuditFilter::default()
        })
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.action)
        .collect()
    }

    /// Retention removes what is past it, over many batches, and keeps the rest,
    /// including an older event written after a younger one (writers overlap).
    #[tokio::test]
    async fn retention_removes_old_events_in_batches_and_keeps_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("brig.db")).unwrap();
        let old = rfc3339_before(Duration::from_secs(3600));
        let young = now_rfc3339();
        let n_old = PRUNE_BATCH as usize * 2 + 7;
        for n in 0..n_old {
            // A young one among the oldest: the batch it is in goes on past it.
            let time = if n == 3 { &young } else { &old };
            db.insert_audit(event_at(time, n)).await.unwrap();
        }
        db.insert_audit(event_at(&young, n_old)).await.unwrap();
        // Older than its predecessor: written late.
        db.insert_audit(event_at(&old, n_old + 1)).await.unwrap();
        db.insert_audit(event_at(&young, n_old + 2)).await.unwrap();

        let removed = prune(&db, Duration::from_secs(60)).await.unwrap();
        assert_eq!(removed, n_old);
        let kept = actions(&db).await;
        assert_eq!(
            kept,
            ["a3", &format!("a{n_old}"), &format!("a{}", n_old + 2)]
        );
        // Nothing more to do; a retention longer than every age removes nothing.
        assert_eq!(prune(&db, Duration::from_secs(60)).await.unwrap(), 0);
        assert_eq!(prune(&db, Duration::from_secs(7200)).await.unwrap(), 0);
        assert_eq!(actions(&db).await, kept);
        // Ids are never reused: paging with after_id stays right across a prune.
        let next = db.insert_audit(event_at(&young, 0)).await.unwrap();
        assert!(next > (n_old + 3) as i64, "{next}");
    }

    #[tokio::test]
    async fn events_dated_ahead_by_a_clock_jump_do_not_hold_back_the_old_ones() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("brig.db")).unwrap();
        // The clock ran a year ahead once: more such events than a batch, with the
        // lowest ids, then the clock was set right.
        let ahead = rfc3339_after(Duration::from_secs(86_400 * 365));
        let old = rfc3339_before(Duration::from_secs(3600));
        let n = PRUNE_BATCH as usize + 5;
        for i in 0..n {
            db.insert_audit(event_at(&ahead, i)).await.unwrap();
        }
        for i in n..2 * n {
            db.insert_audit(event_at(&old, i)).await.unwrap();
        }
        assert_eq!(prune(&db, Duration::from_secs(60)).await.unwrap(), n);
        let ahead_ones: Vec<String> = (0..n).map(|i| format!("a{i}")).collect();
        assert_eq!(actions(&db).await, ahead_ones);
    }

    #[test]
    fn recorded_methods_and_paths_are_cut_and_say_how_long_they_were() {
        assert_eq!(bounded("GET", MAX_RECORDED_METHOD), "GET");
        let method = "M".repeat(1100);
        assert_eq!(
            bounded(&method, MAX_RECORDED_METHOD),
            format!("{}… (1100 bytes)", "M".repeat(16))
        );
        // Cut at a character boundary, never inside one.
        let path = format!("/{}", "é".repeat(300));
        let cut = bounded(&path, MAX_RECORDED_PATH);
        assert!(
            cut.starts_with(&path[..255]) && cut.ends_with("… (601 bytes)"),
            "{cut}"
        );
    }

    #[test]
    fn detail_is_bounded() {
        let long = "é".repeat(2000);
        let v = truncate_detail(serde_json::json!({
            "cmd": long,
            "argv": (0..150).map(|i| i.to_string()).collect::<Vec<_>>(),
            "n": 3,
            "nested": {"x": "y".repeat(5000)},
        }));
        let cmd = v["cmd"].as_str().unwrap();
        assert!(
            cmd.len() <= MAX_DETAIL_STRING && cmd.ends_with('…'),
            "{}",
            cmd.len()
        );
        let argv = v["argv"].as_array().unwrap();
        assert_eq!(argv.len(), MAX_DETAIL_ITEMS + 1);
        assert_eq!(argv[MAX_DETAIL_ITEMS], "… 50 more");
        assert_eq!(v["n"], 3);
        assert!(v["nested"]["x"].as_str().unwrap().len() <= MAX_DETAIL_STRING);
        let short = truncate_detail(serde_json::json!("abc"));
        assert_eq!(short, "abc");
        let map: serde_json::Map<String, Value> = (0..120)
            .map(|i| (format!("k{i:03}"), Value::from(i)))
            .collect();
        let v = truncate_detail(Value::Object(map));
        assert_eq!(v.as_object().unwrap().len(), MAX_DETAIL_ITEMS + 1);
        assert_eq!(v["…"], 20);
        // A hundred arguments of control bytes (six bytes each as JSON) stay within
        // the budget, with what fits of them kept.
        let argv: Vec<String> = (0..100).map(|_| "\u{1}".repeat(1024)).collect();
        let v = truncate_detail(serde_json::json!({"argv": argv, "cmd": null}));
        let stored = serde_json::to_vec(&v).unwrap().len();
        assert!(stored <= MAX_DETAIL_BYTES, "{stored}");
        assert!(!v["argv"].as_array().unwrap().is_empty(), "{v}");
        let deep = (0..10).fold(Value::from("x".repeat(1000)), |v, _| {
            serde_json::json!([v, v])
        });
        assert!(serde_json::to_vec(&truncate_detail(deep)).unwrap().len() <= MAX_DETAIL_BYTES);
    }
}
