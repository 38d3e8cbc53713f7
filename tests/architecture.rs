//! The layers show in the dependency graph: a lower layer never gains a dependency
//! on an upper one or on what only front ends may know (HTTP, the CLI, SQL). The
//! graph is read from `cargo metadata`, so a new dependency anywhere below fails
//! here, whatever pulls it in.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use serde_json::Value;

/// HTTP servers and clients, OpenAPI, the CLI parser: what only front ends know.
const HTTP_AND_CLI: &[&str] = &[
    "axum",
    "hyper",
    "hyper-util",
    "tower",
    "tower-http",
    "http",
    "utoipa",
    "utoipa-axum",
    "ureq",
    "clap",
];

/// What the session engine may use and the layers below it may not: SQLite, the
/// async runtime, the metrics recorder.
const ENGINE_ONLY: &[&str] = &["rusqlite", "tokio", "metrics"];

/// Each layer, bottom first, with the workspace crates it may depend on and
/// whether it may use what the engine uses.
const LAYERS: &[(&str, &[&str], bool)] = &[
    ("brig-sys", &[], false),
    ("brig-policy", &[], false),
    ("brig-jail", &["brig-policy", "brig-sys"], false),
    // Images share kernel calls with the enforcement layer through brig-sys, and
    // know nothing of how a sandbox is built.
    ("brig-image", &["brig-policy", "brig-sys"], false),
    // The egress proxy: the policy's decisions on a runtime, and no HTTP framework
    // (it parses request heads with httparse); the engine and `brig run` use it.
    ("brig-net", &["brig-policy"], true),
    // The daemon's domain: every front end (REST, onyx, E2B, MCP) calls it, so it
    // knows none of them.
    (
        "brig-engine",
        &["brig-policy", "brig-sys", "brig-jail", "brig-image"],
        true,
    ),
];

/// Every package the named package depends on for its build (normal and build
/// dependencies, transitively; dev-dependencies left out), by name.
fn dependencies(metadata: &Value) -> BTreeMap<String, BTreeSet<String>> {
    let packages = metadata["packages"].as_array().unwrap();
    let name_of: BTreeMap<&str, &str> = packages
        .iter()
        .map(|p| (p["id"].as_str().unwrap(), p["name"].as_str().unwrap()))
        .collect();
    let nodes = metadata["resolve"]["nodes"].as_array().unwrap();
    let direct: BTreeMap<&str, Vec<&str>> = nodes
        .iter()
        .map(|node| {
            let deps = node["deps"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|dep| {
                    dep["dep_kinds"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|kind| kind["kind"].as_str() != Some("dev"))
                })
                .map(|dep| dep["pkg"].as_str().unwrap())
                .collect();
            (node["id"].as_str().unwrap(), deps)
        })
        .collect();
    let mut all = BTreeMap::new();
    for (id, name) in &name_of {
        let mut seen = BTreeSet::new();
        let mut stack = direct.get(id).cloned().unwrap_or_default();
        while let Some(dep) = stack.pop() {
            if seen.insert(dep) {
                stack.extend(direct.get(dep).cloned().unwrap_or_default());
            }
        }
        all.insert(
            name.to_string(),
            seen.iter().map(|id| name_of[id].to_string()).collect(),
        );
    }
    all
}

#[test]
fn no_layer_knows_what_the_layers_above_it_know() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // This machine's platform only: other platforms' crates are never downloaded.
    let platform = format!("{}-unknown-linux-gnu", std::env::consts::ARCH);
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--offline"])
        .args(["--filter-platform", &platform])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metadata: Value = serde_json::from_slice(&out.stdout).unwrap();
    let deps = dependencies(&metadata);
    let workspace: BTreeSet<&str> = [
        "brig",
        "brig-sys",
        "brig-policy",
        "brig-jail",
        "brig-image",
        "brig-engine",
        "brig-server",
    ]
    .into_iter()
    .collect();
    for (layer, allowed, engine) in LAYERS {
        let below = &deps[*layer];
        let forbidden: Vec<&String> = below
            .iter()
            .filter(|dep| {
                HTTP_AND_CLI.contains(&dep.as_str())
                    || (!engine && ENGINE_ONLY.contains(&dep.as_str()))
            })
            .collect();
        assert!(
            forbidden.is_empty(),
            "{layer} depends on {forbidden:?}, which only front ends may use"
        );
        let upward: Vec<&String> = below
            .iter()
            .filter(|dep| workspace.contains(dep.as_str()) && !allowed.contains(&dep.as_str()))
            .collect();
        assert!(
            upward.is_empty(),
            "{layer} depends on {upward:?}, a layer it may not know"
        );
    }
    // The check sees what it guards: the daemon does use them.
    assert!(deps["brig-server"].contains("axum"));
    assert!(deps["brig-engine"].contains("rusqlite"));
    assert!(deps["brig-image"].contains("brig-sys"));
}
