//! The control plane's bodies, field for field as E2B's OpenAPI spec (and the SDK
//! generated from it) names them, and how brig's sessions are shown in them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use brig_engine::sessions::SessionInfo;

/// The metadata key under which a sandbox keeps the template it was created from
/// (brig's sessions have an image, E2B's sandboxes a template; several templates
/// may run one image). Not shown in E2B's `metadata`, and refused there.
pub const TEMPLATE_KEY: &str = "e2b.template";

/// E2B's `clientID`: a field kept for old SDKs, one value for all.
const CLIENT_ID: &str = "brig";

/// `endAt` of a sandbox with no end (one made through brig's own API without a
/// TTL): E2B's always end, so the SDK needs a time.
const NO_END: &str = "9999-12-31T23:59:59Z";

/// `POST /sandboxes` and `POST /v2/sandboxes` (`NewSandbox`, `NewSandboxV2`). v1's
/// `secure` is not read: every sandbox is (its envd needs its access token).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// Seconds; E2B's default is 300.
    pub timeout: Option<i64>,
    pub auto_pause: Option<bool>,
    pub auto_pause_memory: Option<bool>,
    pub auto_resume: Option<Value>,
    #[serde(rename = "allow_internet_access")]
    pub allow_internet_access: Option<bool>,
    pub network: Option<NetworkConfig>,
    pub metadata: Option<BTreeMap<String, String>>,
    pub env_vars: Option<BTreeMap<String, String>>,
    pub mcp: Option<Value>,
    pub iam: Option<Value>,
    pub volume_mounts: Option<Vec<Value>>,
}

/// `network` of a create (`SandboxNetworkConfig`) and the body of `PUT
/// /sandboxes/{id}/network` (`SandboxNetworkUpdateConfig`). `allowPublicTraffic`
/// is not read: brig's sandbox ports always need the sandbox's token.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkConfig {
    pub allow_out: Option<Vec<String>>,
    pub deny_out: Option<Vec<String>>,
    pub dns_servers: Option<Vec<String>>,
    pub egress_proxy: Option<Value>,
    pub mask_request_host: Option<String>,
    pub https_ports: Option<Vec<u16>>,
    pub rules: Option<Value>,
    /// Only in the update's body.
    #[serde(rename = "allow_internet_access")]
    pub allow_internet_access: Option<bool>,
}

/// `POST /sandboxes/{id}/timeout` (`SandboxTimeoutRequest`).
#[derive(Debug, Deserialize)]
pub struct TimeoutRequest {
    pub timeout: i64,
}

/// `POST /sandboxes/{id}/refreshes` (`SandboxRefreshRequest`).
#[derive(Debug, Deserialize)]
pub struct RefreshRequest {
    pub duration: Option<i64>,
}

/// `POST /v2/sandboxes/{id}/connect`, `/sandboxes/{id}/connect` and `/resume`
/// (`ConnectSandboxV2`, `ConnectSandbox`, `ResumedSandbox`).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConnectRequest {
    pub timeout: Option<i64>,
    pub auto_pause: Option<bool>,
    pub memory: Option<bool>,
}

/// `POST /sandboxes/{id}/pause` (`SandboxPauseRequest`).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PauseRequest {
    pub memory: Option<bool>,
}

/// `POST /sandboxes/{id}/snapshots` (`SandboxSnapshotRequest`).
#[derive(Debug, Deserialize)]
pub struct SnapshotRequest {
    pub name: Option<String>,
    pub memory: Option<bool>,
}

/// `POST /sandboxes/{id}/fork` (`SandboxForkRequest`).
#[derive(Debug, Deserialize)]
pub struct ForkRequest {
    pub timeout: Option<i64>,
    pub count: Option<i64>,
}

/// A sandbox just created, connected to or resumed (`Sandbox`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Sandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: String,
    pub envd_version: String,
    pub alias: String,
    pub envd_access_token: String,
    pub traffic_access_token: String,
    pub domain: Option<String>,
}

/// The template a session shows: the one it was created from through E2B, else
/// what it runs.
pub fn template_of(info: &SessionInfo) -> String {
    info.metadata
        .get(TEMPLATE_KEY)
        .cloned()
        .or_else(|| info.snapshot.clone())
        .or_else(|| info.image.clone())
        .unwrap_or_else(|| "base".to_string())
}

/// The caller's own labels: without brig's template key.
fn metadata_of(info: &SessionInfo) -> BTreeMap<String, String> {
    let mut metadata = info.metadata.clone();
    metadata.remove(TEMPLATE_KEY);
    metadata
}

/// A sandbox with its access tokens (`envd`, `traffic`).
pub fn sandbox(info: &SessionInfo, (envd, traffic): (String, String)) -> Sandbox {
    let template = template_of(info);
    Sandbox {
        template_id: template.clone(),
        sandbox_id: info.session_id.clone(),
        client_id: CLIENT_ID.to_string(),
        envd_version: super::super::ENVD_VERSION.to_string(),
        alias: template,
        envd_access_token: envd,
        traffic_access_token: traffic,
        domain: None,
    }
}

/// CPUs, memory and disk as E2B counts them (whole CPUs, MiB).
fn sizes(info: &SessionInfo) -> (u64, u64, u64) {
    let limits = &info.limits;
    let cpus = limits["cpus_millis"]
        .as_u64()
        .map(|m| m.div_ceil(1000).max(1))
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get() as u64)
                .unwrap_or(1)
        });
    let memory = limits["memory_bytes"].as_u64().unwrap_or(0) >> 20;
    let disk = limits["disk_bytes"].as_u64().unwrap_or(0) >> 20;
    (cpus, memory, disk)
}

/// A sandbox as lists show it (`ListedSandbox`).
pub fn listed(info: &SessionInfo) -> Value {
    let template = template_of(info);
    let (cpus, memory, disk) = sizes(info);
    serde_json::json!({
        "templateID": template,
        "alias": template,
        "sandboxID": info.session_id,
        "clientID": CLIENT_ID,
        "startedAt": info.created_at,
        "endAt": info.expires_at.as_deref().unwrap_or(NO_END),
        "cpuCount": cpus,
        "memoryMB": memory,
        "diskSizeMB": disk,
        "metadata": metadata_of(info),
        "state": info.state,
        "envdVersion": super::super::ENVD_VERSION,
    })
}

/// A sandbox as `GET /sandboxes/{id}` shows it (`SandboxDetail`).
/// `pauses`: whether its timeout pauses it (`autoPause`) rather than kills it.
pub fn detail(info: &SessionInfo, envd_token: String, pauses: bool) -> Value {
    let mut value = listed(info);
    let network = &info.network;
    let (allow_out, deny_out, internet) = match network.mode.as_str() {
        "open" => (Vec::new(), network.deny.clone(), Some(true)),
        "allow" => (network.allow.clone(), vec![ALL_IPV4.to_string()], None),
        _ => (Vec::new(), vec![ALL_IPV4.to_string()], Some(false)),
    };
    if let Value::Object(fields) = &mut value {
        fields.insert("envdAccessToken".into(), envd_token.into());
        fields.insert("domain".into(), Value::Null);
        fields.insert("allowInternetAccess".into(), internet.into());
        fields.insert(
            "network".into(),
            serde_json::json!({"allowOut": allow_out, "denyOut": deny_out}),
        );
        fields.insert(
            "lifecycle".into(),
            serde_json::json!({"autoResume": false, "onTimeout": if pauses { "pause" } else { "kill" }}),
        );
    }
    value
}

/// E2B's way of saying "no address at all" in `denyOut`.
pub const ALL_IPV4: &str = "0.0.0.0/0";
