//! envd's `process.Process` service over brig's background processes
//! (`brig_engine::sessions::processes`).
//!
//! A command runs as a background process of the session, its output followed
//! from its files; its pid is brig's process id. What envd echoes back about a
//! process that brig does not keep (its pid in the sandbox, tag, envs and cwd) is
//! held here, in memory, for the processes started through this daemon: after a
//! restart they are known by brig's process id, and listed as brig lists them.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use base64::Engine;
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};

use brig_engine::sessions::exec::Stream;
use brig_engine::sessions::processes::{self, Offsets, ProcessEvent, ProcessInfo, StartProcess};
use brig_engine::state::AppState;

use super::connect::{self, Code, ConnectError, Incoming, Sender, Streamed, Unary};
use super::{check_user, resolve_path, USER};
use crate::e2b::SandboxCall;

/// How long a StreamInput client may send nothing (envd's keepalives come more
/// often than this).
const INPUT_IDLE: Duration = Duration::from_secs(120);

/// What envd reports of a process that brig does not keep.
#[derive(Clone, Debug, Default)]
struct Config {
    /// The pid in the sandbox, which envd's clients know a process by (they may
    /// `kill` it from a command).
    pid: Option<u32>,
    tag: Option<String>,
    envs: BTreeMap<String, String>,
    cwd: Option<String>,
}

/// The configs of processes started here, by session and pid.
fn configs() -> &'static Mutex<HashMap<(String, u64), Config>> {
    static CONFIGS: OnceLock<Mutex<HashMap<(String, u64), Config>>> = OnceLock::new();
    CONFIGS.get_or_init(Default::default)
}

/// The pid envd's clients know process `id` by: its pid in the sandbox if this
/// daemon started it, else brig's id.
fn e2b_pid(session: &str, id: u64) -> Result<u32, ConnectError> {
    match config_of(session, id).pid {
        Some(pid) => Ok(pid),
        None => pid_u32(id),
    }
}

/// brig's id of the process envd's clients call `pid`.
fn brig_id(session: &str, pid: u32) -> Option<u64> {
    let configs = configs().lock().unwrap_or_else(|e| e.into_inner());
    let mut known = configs.iter().filter(|((s, _), _)| s == session);
    // The newest of that pid: the kernel may have given it again since.
    let newest = known
        .clone()
        .filter(|(_, c)| c.pid == Some(pid))
        .map(|((_, id), _)| *id)
        .max();
    if newest.is_some() {
        return newest;
    }
    // brig's own id, unless that names a process known by another pid.
    let id = u64::from(pid);
    match known.find(|((_, i), _)| *i == id) {
        Some((_, c)) if c.pid.is_some() => None,
        _ => Some(id),
    }
}

fn config_of(session: &str, pid: u64) -> Config {
    let configs = configs().lock().unwrap_or_else(|e| e.into_inner());
    configs
        .get(&(session.to_string(), pid))
        .cloned()
        .unwrap_or_default()
}

/// Forgets the configs of sessions gone. Those of ended processes stay while their
/// session lives (as brig's own records of them do), so that a pid never comes to
/// name another process.
fn prune(state: &AppState) {
    let mut configs = configs().lock().unwrap_or_else(|e| e.into_inner());
    configs.retain(|(s, _), _| state.sessions().get(s).is_some());
}

/// A uint32 as protobuf's JSON gives it: a number, or a string of one.
fn de_u32<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    let value = Option::<Value>::deserialize(d)?;
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| serde::de::Error::custom("not a uint32")),
        Some(Value::String(s)) => s
            .parse()
            .map(Some)
            .map_err(|_| serde::de::Error::custom("not a uint32")),
        Some(_) => Err(serde::de::Error::custom("not a uint32")),
    }
}

#[derive(Deserialize, Default, Debug)]
#[serde(default)]
struct ProcessConfig {
    cmd: String,
    args: Option<Vec<String>>,
    envs: Option<BTreeMap<String, String>>,
    cwd: Option<String>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(default)]
pub struct StartRequest {
    process: Option<ProcessConfig>,
    pty: Option<Value>,
    tag: Option<String>,
    stdin: Option<bool>,
}

#[derive(Deserialize, Default, Debug, Clone)]
#[serde(default)]
struct Selector {
    #[serde(deserialize_with = "de_u32")]
    pid: Option<u32>,
    tag: Option<String>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(default)]
pub struct SelectorRequest {
    process: Option<Selector>,
    pty: Option<Value>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(default)]
struct Input {
    stdin: Option<String>,
    pty: Option<String>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(default)]
pub struct SendInputRequest {
    process: Option<Selector>,
    input: Option<Input>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(default)]
pub struct SendSignalRequest {
    process: Option<Selector>,
    signal: Option<Value>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(default)]
struct InputStart {
    process: Option<Selector>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(default)]
struct InputData {
    input: Option<Input>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(default)]
struct StreamInputRequest {
    start: Option<InputStart>,
    data: Option<InputData>,
}

fn no_pty() -> ConnectError {
    ConnectError::unimplemented(
        "brig runs commands without a terminal: PTY sessions are not supported",
    )
}

fn pid_u32(pid: u64) -> Result<u32, ConnectError> {
    u32::try_from(pid).map_err(|_| ConnectError::new(Code::Internal, "process id over uint32"))
}

/// The running process a selector names (envd knows only running ones).
async fn select(
    state: &AppState,
    call: &SandboxCall,
    selector: Option<&Selector>,
    running_only: bool,
) -> Result<ProcessInfo, ConnectError> {
    let selector = selector.cloned().unwrap_or_default();
    let found = match (selector.pid, selector.tag) {
        (Some(pid), _) => {
            let not_found = || ConnectError::not_found(format!("process with pid {pid} not found"));
            let Some(id) = brig_id(&call.session_id, pid) else {
                return Err(not_found());
            };
            match processes::get(state, &call.caller, &call.session_id, id).await {
                Ok(info) => Ok(info),
                Err(e) if e.code == brig_engine::fault::ErrorCode::NotFound => Err(not_found()),
                Err(e) => Err(e.into()),
            }
            .and_then(|info| {
                if running_only && info.state != "running" {
                    Err(not_found())
                } else {
                    Ok(info)
                }
            })
        }
        (None, Some(tag)) => {
            let list = processes::list(state, &call.caller, &call.session_id).await?;
            list.into_iter()
                .rev()
                .filter(|p| !running_only || p.state == "running")
                .find(|p| config_of(&call.session_id, p.process_id).tag.as_deref() == Some(&tag))
                .ok_or_else(|| ConnectError::not_found(format!("process with tag {tag} not found")))
        }
        (None, None) => Err(ConnectError::invalid("no process selected (pid or tag)")),
    };
    found
}

fn b64(data: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(data.as_bytes())
}

fn unb64(data: &str) -> Result<Vec<u8>, ConnectError> {
    let engine = &base64::engine::general_purpose::STANDARD;
    engine
        .decode(data.trim_end_matches('='))
        .or_else(|_| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(data.trim_end_matches('='))
        })
        .or_else(|_| engine.decode(data))
        .map_err(|e| ConnectError::invalid(format!("input is not base64: {e}")))
}

/// Go's name of a signal in `ProcessState.String()`.
fn signal_name(signal: i32) -> String {
    match signal {
        1 => "hangup".into(),
        2 => "interrupt".into(),
        3 => "quit".into(),
        6 => "aborted".into(),
        9 => "killed".into(),
        11 => "segmentation fault".into(),
        13 => "broken pipe".into(),
        14 => "alarm clock".into(),
        15 => "terminated".into(),
        other => format!("signal {other}"),
    }
}

/// envd's end event: Go's `ProcessState` of the process.
fn end_event(exit_code: Option<i32>, signal: Option<i32>) -> Value {
    let (code, exited, status) = match (exit_code, signal) {
        (Some(code), _) => (code, true, format!("exit status {code}")),
        (None, Some(signal)) => (-1, false, format!("signal: {}", signal_name(signal))),
        (None, None) => (-1, false, "ended (how is not known)".to_string()),
    };
    let mut end = json!({"exitCode": code, "exited": exited, "status": status});
    if code != 0 {
        end["error"] = json!(status);
    }
    json!({"event": {"end": end}})
}

fn keepalive_interval(headers: &HeaderMap) -> Option<Duration> {
    headers
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map(Duration::from_secs)
}

/// Streams a process's events: start, its output (`events`), its end.
async fn pump(
    events: impl futures_util::Stream<Item = ProcessEvent> + Send + 'static,
    pid: u32,
    sender: Sender,
    keepalive: Option<Duration>,
    deadline: Option<Duration>,
) {
    if !sender
        .send(&json!({"event": {"start": {"pid": pid}}}))
        .await
    {
        return;
    }
    let mut events = std::pin::pin!(events);
    let until = deadline.map(|d| tokio::time::Instant::now() + d);
    let never = Duration::from_secs(86_400 * 365);
    loop {
        let ping = tokio::time::sleep(keepalive.unwrap_or(never));
        let expiry =
            tokio::time::sleep_until(until.unwrap_or_else(|| tokio::time::Instant::now() + never));
        tokio::select! {
            event = events.next() => match event {
                Some(ProcessEvent::Output(stream, text)) => {
                    if text.is_empty() {
                        continue;
                    }
                    let key = match stream {
                        Stream::Stdout => "stdout",
                        Stream::Stderr => "stderr",
                    };
                    let event = json!({"event": {"data": {key: b64(&text)}}});
                    if !sender.send(&event).await {
                        return;
                    }
                }
                Some(ProcessEvent::Exit { exit_code, signal }) => {
                    if sender.send(&end_event(exit_code, signal)).await {
                        sender.end(None).await;
                    }
                    return;
                }
                None => {
                    let e = ConnectError::new(
                        Code::Unavailable,
                        "the stream of the process ended before the process did (its sandbox ended, or the stream was idle too long)",
                    );
                    return sender.end(Some(e)).await;
                }
            },
            _ = ping => {
                if !sender.send(&json!({"event": {"keepalive": {}}})).await {
                    return;
                }
            }
            _ = expiry => {
                let e = ConnectError::new(Code::DeadlineExceeded, "the stream's deadline (Connect-Timeout-Ms) passed");
                return sender.end(Some(e)).await;
            }
        }
    }
}

pub async fn start(
    State(state): State<AppState>,
    Extension(call): Extension<SandboxCall>,
    request: Streamed<StartRequest>,
) -> Response {
    let pid = match start_process(&state, &call, &request).await {
        Ok(pid) => pid,
        Err(e) => return connect::stream_error(e),
    };
    let followed = async {
        let events = processes::follow(
            &state,
            &call.caller,
            &call.session_id,
            pid,
            Offsets::default(),
        )
        .await?;
        Ok::<_, ConnectError>((events, e2b_pid(&call.session_id, pid)?))
    }
    .await;
    let (events, pid32) = match followed {
        Ok(found) => found,
        Err(e) => {
            // Not left running for a client that was told it failed (a tenant
            // at its cap of streams).
            let kill = json!("KILL");
            let _ = processes::signal(&state, &call.caller, &call.session_id, pid, &kill).await;
            return connect::stream_error(e);
        }
    };
    let (sender, response) = connect::stream();
    let keepalive = keepalive_interval(&request.headers);
    tokio::spawn(pump(events, pid32, sender, keepalive, request.deadline));
    response
}

async fn start_process(
    state: &AppState,
    call: &SandboxCall,
    request: &Streamed<StartRequest>,
) -> Result<u64, ConnectError> {
    check_user(&request.headers)?;
    let message = &request.message;
    if message.pty.is_some() {
        return Err(no_pty());
    }
    let config = message.process.as_ref();
    let cmd = config.map(|c| c.cmd.clone()).unwrap_or_default();
    if cmd.is_empty() {
        return Err(ConnectError::invalid("process.cmd is empty"));
    }
    let args = config.and_then(|c| c.args.clone()).unwrap_or_default();
    let envs = config.and_then(|c| c.envs.clone()).unwrap_or_default();
    let cwd_asked = config.and_then(|c| c.cwd.clone());
    let cwd = resolve_path(cwd_asked.as_deref().unwrap_or(""), &call.home)?;
    match brig_engine::sessions::entries::stat(state, &call.caller, &call.session_id, &cwd).await {
        Ok(_) => {}
        Err(e) if e.code == brig_engine::fault::ErrorCode::NoSuchFile => {
            return Err(ConnectError::invalid(format!("cwd '{cwd}' does not exist")))
        }
        Err(e) => return Err(e.into()),
    }
    // envd's defaults first, the caller's on top.
    let mut env: BTreeMap<String, String> = [
        ("HOME", call.home.as_str()),
        ("USER", USER),
        ("LOGNAME", USER),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    // As Go's exec gives envd's children: a shell then names its directory as asked
    // (`pwd` says /home/user where that is a link to the workspace).
    env.insert("PWD".to_string(), cwd.clone());
    env.extend(envs.clone());
    let mut argv = vec![cmd];
    argv.extend(args);
    let start = StartProcess {
        argv: Some(argv),
        cmd: None,
        cwd: Some(cwd),
        env: Some(env),
    };
    let info = processes::start(state, &call.caller, &call.session_id, &start).await?;
    let pid = info.process_id;
    pid_u32(pid)?;
    configs().lock().unwrap_or_else(|e| e.into_inner()).insert(
        (call.session_id.clone(), pid),
        Config {
            pid: info.sandbox_pid.and_then(|p| u32::try_from(p).ok()),
            tag: message.tag.clone(),
            envs,
            cwd: cwd_asked,
        },
    );
    if message.stdin == Some(false) {
        close(state, call, pid).await?;
    }
    if let Some(deadline) = request.deadline {
        // envd ends the process with the call's deadline, whether or not its
        // client still listens.
        let (state, call) = (state.clone(), call.clone());
        tokio::spawn(async move {
            tokio::time::sleep(deadline).await;
            let _ = processes::signal(&state, &call.caller, &call.session_id, pid, &json!("KILL"))
                .await;
        });
    }
    Ok(pid)
}

pub async fn connect(
    State(state): State<AppState>,
    Extension(call): Extension<SandboxCall>,
    request: Streamed<SelectorRequest>,
) -> Response {
    let info = match select(&state, &call, request.message.process.as_ref(), false).await {
        Ok(info) => info,
        Err(e) => return connect::stream_error(e),
    };
    // Output from now on, as envd gives a client that attaches.
    let from = Offsets {
        stdout: info.stdout_bytes,
        stderr: info.stderr_bytes,
    };
    let followed = async {
        let id = info.process_id;
        let events = processes::follow(&state, &call.caller, &call.session_id, id, from).await?;
        Ok::<_, ConnectError>((events, e2b_pid(&call.session_id, id)?))
    }
    .await;
    let (events, pid32) = match followed {
        Ok(found) => found,
        Err(e) => return connect::stream_error(e),
    };
    let (sender, response) = connect::stream();
    let keepalive = keepalive_interval(&request.headers);
    tokio::spawn(pump(events, pid32, sender, keepalive, request.deadline));
    response
}

pub async fn list(
    State(state): State<AppState>,
    Extension(call): Extension<SandboxCall>,
    _request: Unary<Value>,
) -> Response {
    let all = match processes::list(&state, &call.caller, &call.session_id).await {
        Ok(all) => all,
        Err(e) => return ConnectError::from(e).into_response(),
    };
    let running: Vec<ProcessInfo> = all.into_iter().filter(|p| p.state == "running").collect();
    prune(&state);
    let processes: Vec<Value> = running
        .iter()
        .filter_map(|p| {
            let pid = e2b_pid(&call.session_id, p.process_id).ok()?;
            let config = config_of(&call.session_id, p.process_id);
            let mut process = json!({
                "pid": pid,
                "config": {
                    "cmd": p.argv.first().cloned().unwrap_or_default(),
                    "args": p.argv.iter().skip(1).collect::<Vec<_>>(),
                    "envs": config.envs,
                }
            });
            if let Some(cwd) = config.cwd {
                process["config"]["cwd"] = json!(cwd);
            }
            if let Some(tag) = config.tag {
                process["tag"] = json!(tag);
            }
            Some(process)
        })
        .collect();
    connect::unary(&json!({"processes": processes}))
}

async fn write(
    state: &AppState,
    call: &SandboxCall,
    pid: u64,
    data: Vec<u8>,
) -> Result<(), ConnectError> {
    let len = data.len() as u64;
    let body = futures_util::stream::once(async move { Ok::<_, std::convert::Infallible>(data) });
    processes::write_stdin(
        state,
        &call.caller,
        &call.session_id,
        pid,
        Some(len),
        body,
        false,
    )
    .await
    .map_err(stdin_error)
}

async fn close(state: &AppState, call: &SandboxCall, pid: u64) -> Result<(), ConnectError> {
    let body = futures_util::stream::empty::<Result<Vec<u8>, std::convert::Infallible>>();
    match processes::write_stdin(
        state,
        &call.caller,
        &call.session_id,
        pid,
        Some(0),
        body,
        true,
    )
    .await
    {
        // Closed already: envd takes a second close as done.
        Err(e) if e.code == brig_engine::fault::ErrorCode::Conflict => Ok(()),
        other => other.map_err(ConnectError::from),
    }
}

fn stdin_error(e: brig_engine::fault::Error) -> ConnectError {
    if e.code == brig_engine::fault::ErrorCode::Conflict {
        return ConnectError::new(
            Code::FailedPrecondition,
            format!(
                "error writing to stdin: stdin not enabled or closed ({})",
                e.message
            ),
        );
    }
    e.into()
}

fn stdin_of(input: Option<&Input>) -> Result<Vec<u8>, ConnectError> {
    match input {
        Some(Input {
            stdin: Some(data), ..
        }) => unb64(data),
        Some(Input { pty: Some(_), .. }) => Err(no_pty()),
        _ => Ok(Vec::new()),
    }
}

pub async fn send_input(
    State(state): State<AppState>,
    Extension(call): Extension<SandboxCall>,
    request: Unary<SendInputRequest>,
) -> Response {
    let result = async {
        let info = select(&state, &call, request.message.process.as_ref(), true).await?;
        let data = stdin_of(request.message.input.as_ref())?;
        write(&state, &call, info.process_id, data).await
    }
    .await;
    match result {
        Ok(()) => connect::unary(&json!({})),
        Err(e) => e.into_response(),
    }
}

pub async fn stream_input(
    State(state): State<AppState>,
    Extension(call): Extension<SandboxCall>,
    mut incoming: Incoming,
) -> Response {
    let result = async {
        let mut pid = None;
        while let Some(message) = incoming.next::<StreamInputRequest>(INPUT_IDLE).await? {
            if let Some(start) = message.start {
                let info = select(&state, &call, start.process.as_ref(), true).await?;
                pid = Some(info.process_id);
            } else if let Some(data) = message.data {
                let Some(pid) = pid else {
                    return Err(ConnectError::invalid("input data before the start event"));
                };
                let bytes = stdin_of(data.input.as_ref())?;
                if !bytes.is_empty() {
                    write(&state, &call, pid, bytes).await?;
                }
            }
        }
        Ok(())
    }
    .await;
    let (sender, response) = connect::stream();
    tokio::spawn(async move {
        match result {
            Ok(()) => {
                if sender.send(&json!({})).await {
                    sender.end(None).await;
                }
            }
            Err(e) => sender.end(Some(e)).await,
        }
    });
    response
}

pub async fn send_signal(
    State(state): State<AppState>,
    Extension(call): Extension<SandboxCall>,
    request: Unary<SendSignalRequest>,
) -> Response {
    let result = async {
        let info = select(&state, &call, request.message.process.as_ref(), true).await?;
        let signal = match &request.message.signal {
            Some(Value::String(s)) if s == "SIGNAL_SIGKILL" => "KILL",
            Some(Value::String(s)) if s == "SIGNAL_SIGTERM" => "TERM",
            Some(Value::Number(n)) if n.as_i64() == Some(9) => "KILL",
            Some(Value::Number(n)) if n.as_i64() == Some(15) => "TERM",
            other => {
                return Err(ConnectError::unimplemented(format!(
                    "invalid signal: {}",
                    other.clone().unwrap_or(Value::Null)
                )))
            }
        };
        processes::signal(
            &state,
            &call.caller,
            &call.session_id,
            info.process_id,
            &json!(signal),
        )
        .await
        .map_err(ConnectError::from)
    }
    .await;
    match result {
        Ok(()) => connect::unary(&json!({})),
        Err(e) => e.into_response(),
    }
}

pub async fn close_stdin(
    State(state): State<AppState>,
    Extension(call): Extension<SandboxCall>,
    request: Unary<SelectorRequest>,
) -> Response {
    let result = async {
        let info = select(&state, &call, request.message.process.as_ref(), true).await?;
        close(&state, &call, info.process_id).await
    }
    .await;
    match result {
        Ok(()) => connect::unary(&json!({})),
        Err(e) => e.into_response(),
    }
}

pub async fn update(
    State(state): State<AppState>,
    Extension(call): Extension<SandboxCall>,
    request: Unary<SelectorRequest>,
) -> Response {
    let result = async {
        select(&state, &call, request.message.process.as_ref(), true).await?;
        if request.message.pty.is_some() {
            return Err(no_pty());
        }
        Ok(())
    }
    .await;
    match result {
        Ok(()) => connect::unary(&json!({})),
        Err(e) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ends_read_as_gos_process_state() {
        let ok = end_event(Some(0), None);
        assert_eq!(ok["event"]["end"]["status"], "exit status 0");
        assert!(ok["event"]["end"].get("error").is_none());
        let failed = end_event(Some(3), None);
        assert_eq!(failed["event"]["end"]["error"], "exit status 3");
        let killed = end_event(None, Some(9));
        assert_eq!(killed["event"]["end"]["exitCode"], -1);
        assert_eq!(killed["event"]["end"]["status"], "signal: killed");
    }

    #[test]
    fn selectors_take_numbers_and_strings() {
        let s: Selector = serde_json::from_str(r#"{"pid": 7}"#).unwrap();
        assert_eq!(s.pid, Some(7));
        let s: Selector = serde_json::from_str(r#"{"pid": "8"}"#).unwrap();
        assert_eq!(s.pid, Some(8));
        assert!(serde_json::from_str::<Selector>(r#"{"pid": -1}"#).is_err());
        let s: Selector = serde_json::from_str(r#"{"tag": "t"}"#).unwrap();
        assert_eq!(s.tag.as_deref(), Some("t"));
    }

    #[test]
    fn input_is_base64() {
        assert_eq!(unb64("aGk=").unwrap(), b"hi");
        assert_eq!(unb64("aGk").unwrap(), b"hi");
        assert!(unb64("***").is_err());
    }
}
