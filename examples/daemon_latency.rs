//! Latency client for `brig serve` benchmarks, in Rust: the same requests as
//! `bench/daemon_load.py`'s `create` and `rtt` patterns, over one kept-alive
//! connection (ureq, the HTTP client brig's own CLI uses), so that what is timed
//! is the server and the sandbox rather than the client. On this 2-vCPU VM
//! Python's http.client and json spend 0.3-0.55 ms of each request in the
//! client (BENCHMARKS.md, session 24), and a create -> first exec is two requests.
//!
//!     cargo run --release --example daemon_latency -- URL KEY create N pooled|busy
//!     cargo run --release --example daemon_latency -- URL KEY rtt N
//!     cargo run --release --example daemon_latency -- URL KEY get N PATH
//!     cargo run --release --example daemon_latency -- - - agent N SOCKET
//!
//! KEY may be "-" for a server without keys (`bench/http_floor.c`). Prints one
//! JSON object with the same fields as daemon_load.py.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

struct Client {
    agent: ureq::Agent,
    url: String,
    key: String,
}

impl Client {
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
        let text = self.call_text(method, path, body)?;
        Ok(if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text)?
        })
    }

    fn call_text(&self, method: &str, path: &str, body: Option<Value>) -> anyhow::Result<String> {
        let uri = format!("{}{}", self.url, path);
        let mut request = ureq::http::Request::builder().method(method).uri(&uri);
        if self.key != "-" {
            request = request.header("Authorization", format!("Bearer {}", self.key));
        }
        let mut response = match body {
            Some(body) => {
                let request = request
                    .header("Content-Type", "application/json")
                    .body(serde_json::to_vec(&body)?)?;
                self.agent.run(request)?
            }
            None => self.agent.run(request.body(())?)?,
        };
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string()?;
        if status >= 300 {
            anyhow::bail!("{method} {path}: {status} {text}");
        }
        Ok(text)
    }

    fn exec_echo(&self, session: &str) -> anyhow::Result<()> {
        let result = self.call(
            "POST",
            &format!("/v1/sessions/{session}/exec"),
            Some(json!({"argv": ["echo", "hello"]})),
        )?;
        anyhow::ensure!(
            result["stdout"] == "hello\n",
            "unexpected exec answer: {result}"
        );
        Ok(())
    }

    fn pool_ready(&self) -> anyhow::Result<f64> {
        let text = self.call_text("GET", "/metrics", None)?;
        Ok(text
            .lines()
            .filter(|line| line.starts_with("brig_pool_ready"))
            .filter_map(|line| line.split_whitespace().last()?.parse::<f64>().ok())
            .sum())
    }
}

fn median(samples: &[f64]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    }
}

/// Milliseconds rounded to the microsecond, as daemon_load.py prints them.
fn to_us(ms: f64) -> f64 {
    (ms * 1000.0).round() / 1000.0
}

fn summary(samples: &[f64]) -> serde_json::Map<String, Value> {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let pick = |q: f64| sorted[((q * sorted.len() as f64) as usize).min(sorted.len() - 1)];
    let mut out = serde_json::Map::new();
    out.insert("n".into(), json!(samples.len()));
    out.insert("median_ms".into(), json!(to_us(median(samples))));
    out.insert("p95_ms".into(), json!(to_us(pick(0.95))));
    out.insert("p99_ms".into(), json!(to_us(pick(0.99))));
    out.insert("min_ms".into(), json!(to_us(sorted[0])));
    out.insert("max_ms".into(), json!(to_us(sorted[sorted.len() - 1])));
    out
}

fn ms(from: Instant, to: Instant) -> f64 {
    to.duration_since(from).as_secs_f64() * 1000.0
}

/// The pattern of daemon_load.py's `create`: "pooled" sleeps 0.3 s before each
/// create (the pool refills, the machine idles); "busy" waits for a settled pool
/// of at least `n` and goes back to back.
fn create(client: &Client, n: usize, pattern: &str) -> anyhow::Result<Value> {
    if pattern == "busy" {
        let mut last = None;
        let mut settled = false;
        for _ in 0..120 {
            let ready = client.pool_ready()?;
            if ready >= n as f64 && last == Some(ready) {
                settled = true;
                break;
            }
            last = Some(ready);
            std::thread::sleep(Duration::from_secs(1));
        }
        anyhow::ensure!(settled, "the pool never settled with {n} sandboxes");
    }
    let (mut totals, mut creates, mut first_execs, mut pooled) = (vec![], vec![], vec![], 0);
    for _ in 0..n {
        if pattern == "pooled" {
            std::thread::sleep(Duration::from_millis(300));
        }
        let start = Instant::now();
        let session = client.call("POST", "/v1/sessions", Some(json!({})))?;
        let created = Instant::now();
        let id = session["session_id"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        client.exec_echo(&id)?;
        let done = Instant::now();
        totals.push(ms(start, done));
        creates.push(ms(start, created));
        first_execs.push(ms(created, done));
        pooled += usize::from(session["pooled"] == true);
        client.call("DELETE", &format!("/v1/sessions/{id}"), None)?;
    }
    let mut out = summary(&totals);
    out.insert("pooled".into(), json!(pooled));
    out.insert("create_median_ms".into(), json!(to_us(median(&creates))));
    out.insert(
        "first_exec_median_ms".into(),
        json!(to_us(median(&first_execs))),
    );
    Ok(Value::Object(out))
}

fn rtt(client: &Client, n: usize) -> anyhow::Result<Value> {
    let session = client.call("POST", "/v1/sessions", Some(json!({})))?;
    let id = session["session_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let timed = (|| {
        for _ in 0..20 {
            client.exec_echo(&id)?;
        }
        let mut samples = Vec::with_capacity(n);
        for _ in 0..n {
            let start = Instant::now();
            client.exec_echo(&id)?;
            samples.push(ms(start, Instant::now()));
        }
        Ok(Value::Object(summary(&samples)))
    })();
    client.call("DELETE", &format!("/v1/sessions/{id}"), None)?;
    timed
}

/// One GET of `path` every 0.3 s, as the "pooled" pattern paces its creates: what
/// any request costs the server after a pause, for comparison with a create.
fn get_after_pause(client: &Client, n: usize, path: &str) -> anyhow::Result<Value> {
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        std::thread::sleep(Duration::from_millis(300));
        let start = Instant::now();
        client.call("GET", path, None)?;
        samples.push(ms(start, Instant::now()));
    }
    Ok(Value::Object(summary(&samples)))
}

/// `echo hello` sent straight to a session's init over its agent socket, one every
/// 0.3 s, with the environment the daemon gives a command: the sandbox's own share
/// of an exec (init's clone, the command's start in its namespaces), without the
/// daemon's HTTP, authentication, audit and database.
fn agent_after_pause(socket: &std::path::Path, n: usize) -> anyhow::Result<Value> {
    use brig_jail::agent::{AgentConnection, AgentReply, AgentRequest};
    use std::io::Read;
    use std::os::fd::AsFd;
    let request = AgentRequest::Exec {
        argv: vec!["echo".into(), "hello".into()],
        env: vec![
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
            "HOME=/workspace".into(),
            "LANG=C.UTF-8".into(),
        ],
        cwd: "/workspace".into(),
        bound: true,
    };
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        std::thread::sleep(Duration::from_millis(300));
        let start = Instant::now();
        let (stdin, _stdin_writer) = std::io::pipe()?;
        let (mut stdout, stdout_writer) = std::io::pipe()?;
        let (mut stderr, stderr_writer) = std::io::pipe()?;
        let mut agent = AgentConnection::connect(socket, false)?;
        agent.send(
            &request,
            &[stdin.as_fd(), stdout_writer.as_fd(), stderr_writer.as_fd()],
        )?;
        drop((stdin, stdout_writer, stderr_writer));
        let mut output = String::new();
        stdout.read_to_string(&mut output)?;
        stderr.read_to_string(&mut String::new())?;
        loop {
            match agent.recv()? {
                Some((AgentReply::Exited { .. }, _)) => break,
                Some((AgentReply::Started { .. }, _)) => continue,
                other => anyhow::bail!("unexpected reply from init: {other:?}"),
            }
        }
        samples.push(ms(start, Instant::now()));
        anyhow::ensure!(output == "hello\n", "unexpected output: {output:?}");
    }
    Ok(Value::Object(summary(&samples)))
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage =
        "usage: daemon_latency URL KEY create N pooled|busy | rtt N | get N PATH | agent N SOCKET";
    let (url, key, mode) = match &args[..] {
        [url, key, mode, ..] => (url.trim_end_matches('/'), key, mode.as_str()),
        _ => anyhow::bail!(usage),
    };
    let n: usize = args
        .get(3)
        .and_then(|n| n.parse().ok())
        .filter(|&n| n > 0)
        .ok_or_else(|| anyhow::anyhow!(usage))?;
    // No timeout: with one, ureq resolves every request's host on a thread of its
    // own, a thread start and two wake-ups per request timed.
    let config = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build();
    let client = Client {
        agent: config.into(),
        url: url.to_owned(),
        key: key.clone(),
    };
    let out = match (mode, args.get(4).map(String::as_str)) {
        ("create", Some(pattern @ ("pooled" | "busy"))) => create(&client, n, pattern)?,
        ("rtt", None) => rtt(&client, n)?,
        ("get", Some(path)) => get_after_pause(&client, n, path)?,
        ("agent", Some(socket)) => agent_after_pause(socket.as_ref(), n)?,
        _ => anyhow::bail!(usage),
    };
    println!("{out}");
    Ok(())
}
