//! Prometheus metrics: the recorder and what the daemon records. The server renders
//! them on `GET /metrics` (no auth).
//!
//! The `metrics` facade has one global recorder per process, so the Prometheus
//! recorder is installed once (tests build several daemons in one process) and every
//! daemon state renders through the same handle.
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `brig_http_requests_total` | counter | `route`, `method`, `status` |
//! | `brig_http_request_duration_seconds` | histogram | `route`, `method` |
//! | `brig_execs_total` | counter | `outcome` |
//! | `brig_execs_running` | gauge | |
//! | `brig_snapshots_running` | gauge | |
//! | `brig_exec_duration_seconds` | histogram | `outcome` |
//! | `brig_sessions` | gauge | `state` |
//! | `brig_pool_ready` | gauge | `image` |
//! | `brig_failures_total` | counter | `code` |

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// Histogram buckets in seconds: from a fast API call to a long exec.
const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// How often histograms are compacted (the recorder does not do it by itself).
pub const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// The daemon's view of the metrics recorder.
#[derive(Clone)]
pub struct Metrics {
    handle: PrometheusHandle,
}

impl Metrics {
    /// The process-wide recorder, installed on first use. If another recorder was
    /// installed first (an embedding program), brig's metrics go there and
    /// `/metrics` renders only what this recorder sees (nothing); that is logged.
    pub fn global() -> Metrics {
        let handle = HANDLE.get_or_init(|| {
            let builder = PrometheusBuilder::new();
            // set_buckets fails only on an empty list.
            let builder = match builder.set_buckets(BUCKETS) {
                Ok(b) => b,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics: histogram buckets refused");
                    PrometheusBuilder::new()
                }
            };
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            if let Err(e) = metrics::set_global_recorder(recorder) {
                tracing::warn!(error = %e, "metrics: another recorder is installed; /metrics will be empty");
            }
            describe();
            handle
        });
        Metrics {
            handle: handle.clone(),
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        self.handle.render()
    }

    /// Compacts histograms; run every [`UPKEEP_INTERVAL`].
    pub fn upkeep(&self) {
        self.handle.run_upkeep();
    }

    /// Spawns the periodic upkeep task.
    pub fn spawn_upkeep(&self) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(UPKEEP_INTERVAL);
            loop {
                tick.tick().await;
                this.upkeep();
            }
        })
    }
}

fn describe() {
    metrics::describe_counter!(
        "brig_http_requests_total",
        "HTTP requests by route, method and status"
    );
    metrics::describe_histogram!(
        "brig_http_request_duration_seconds",
        metrics::Unit::Seconds,
        "HTTP request latency until the response head"
    );
    metrics::describe_counter!("brig_execs_total", "finished execs by outcome");
    metrics::describe_gauge!("brig_execs_running", "execs running now");
    metrics::describe_gauge!(
        "brig_snapshots_running",
        "snapshots being taken now (copied or packed)"
    );
    metrics::describe_histogram!(
        "brig_exec_duration_seconds",
        metrics::Unit::Seconds,
        "exec wall time"
    );
    metrics::describe_gauge!("brig_sessions", "sessions by state");
    metrics::describe_gauge!("brig_pool_ready", "ready pooled sandboxes by image");
    metrics::describe_counter!(
        "brig_file_lock_kills_total",
        "processes killed for holding more file locks than their session's budget"
    );
    metrics::describe_counter!(
        "brig_egress_connections_total",
        "connections sessions' proxies allowed or refused"
    );
    metrics::describe_counter!(
        "brig_egress_bytes_total",
        "bytes relayed by sessions' proxies, up (to the upstream) and down"
    );
    metrics::describe_counter!(
        "brig_failures_total",
        "error responses and failures by code"
    );
}

/// An exec started (pair with [`exec_finished`]).
pub fn exec_started() {
    metrics::gauge!("brig_execs_running").increment(1.0);
}

/// An exec ended after `duration`; `outcome` is a small fixed set such as `ok`,
/// `exit_nonzero`, `timeout`, `oom`, `error` (it becomes a label: never put
/// user data in it).
pub fn exec_finished(duration: Duration, outcome: &str) {
    metrics::gauge!("brig_execs_running").decrement(1.0);
    metrics::counter!("brig_execs_total", "outcome" => outcome.to_string()).increment(1);
    metrics::histogram!("brig_exec_duration_seconds", "outcome" => outcome.to_string())
        .record(duration.as_secs_f64());
}

/// A snapshot being taken, counted in `brig_snapshots_running` until dropped.
#[must_use = "it is counted only while it is alive"]
pub struct SnapshotRunning(());

impl Drop for SnapshotRunning {
    fn drop(&mut self) {
        metrics::gauge!("brig_snapshots_running").decrement(1.0);
    }
}

pub fn snapshot_started() -> SnapshotRunning {
    metrics::gauge!("brig_snapshots_running").increment(1.0);
    SnapshotRunning(())
}

/// Processes of sessions killed for holding more file locks than their budget.
pub fn file_lock_kills(processes: u64) {
    metrics::counter!("brig_file_lock_kills_total").increment(processes);
}

/// A connection a session's proxy allowed (and then relayed `up` and `down`
/// bytes) or refused.
pub fn egress_connection(allowed: bool, up: u64, down: u64) {
    let decision = if allowed { "allowed" } else { "refused" };
    metrics::counter!("brig_egress_connections_total", "decision" => decision).increment(1);
    if allowed {
        metrics::counter!("brig_egress_bytes_total", "direction" => "up").increment(up);
        metrics::counter!("brig_egress_bytes_total", "direction" => "down").increment(down);
    }
}

/// The number of sessions in `state` (e.g. `running`, `paused`).
pub fn set_sessions(state: &str, n: f64) {
    metrics::gauge!("brig_sessions", "state" => state.to_string()).set(n);
}

/// The number of ready pooled sandboxes of `image` (`host` for no image).
pub fn set_pool(image: &str, n: f64) {
    metrics::gauge!("brig_pool_ready", "image" => image.to_string()).set(n);
}

/// A failure with a stable error code. Every error response is already counted by
/// the HTTP middleware; call this for failures that are not a response status
/// (an `error` event in a stream, a background task).
pub fn failure(code: &str) {
    metrics::counter!("brig_failures_total", "code" => code.to_string()).increment(1);
}

/// A request answered with `status` after `elapsed` (until its response head).
/// `route` is the route's template, never the raw path (that would make a label
/// per id); `method` one of a fixed set (a label per token a client may send as a
/// method would grow the registry without bound).
pub fn http_request(route: String, method: &'static str, status: u16, elapsed: Duration) {
    metrics::histogram!(
        "brig_http_request_duration_seconds",
        "route" => route.clone(),
        "method" => method
    )
    .record(elapsed.as_secs_f64());
    metrics::counter!(
        "brig_http_requests_total",
        "route" => route,
        "method" => method,
        "status" => status.to_string()
    )
    .increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers_show_up_in_the_text() {
        let m = Metrics::global();
        exec_started();
        exec_finished(Duration::from_millis(30), "ok");
        set_sessions("running", 3.0);
        set_pool("python", 2.0);
        failure("internal");
        m.upkeep();
        let text = m.render();
        for name in [
            "brig_execs_total{outcome=\"ok\"}",
            "brig_exec_duration_seconds_bucket",
            "brig_execs_running",
            "brig_sessions{state=\"running\"} 3",
            "brig_pool_ready{image=\"python\"} 2",
            "brig_failures_total{code=\"internal\"}",
        ] {
            assert!(text.contains(name), "{name} missing from:\n{text}");
        }
        // A second daemon state in the same process shares the recorder.
        assert!(Metrics::global().render().contains("brig_pool_ready"));
    }
}
