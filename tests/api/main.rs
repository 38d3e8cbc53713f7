//! Black-box tests of `brig serve`'s HTTP API (docs/API.md), one module per
//! resource: each test starts a real daemon on a loopback port
//! (tests/common/daemon.rs) and attacks or checks one guarantee. When a daemon is
//! dropped the harness deletes its sessions, stops it and checks that no sandbox
//! process, cgroup leaf or temporary directory is left.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;
mod support;

mod audit;
mod bad_input;
mod connections;
mod e2b_code;
mod e2b_control;
mod e2b_envd;
mod e2b_plane;
mod egress;
mod egress_secrets;
mod exec;
mod file_lease;
mod files;
mod filestore;
mod hostile_tree;
mod http_edges;
mod interpreter;
mod onyx;
mod onyx_mount;
mod openapi;
mod processes;
mod restore;
mod sessions;
mod snapshot_limits;
mod snapshot_quota;
mod snapshots;
mod startup;
mod tenants;
mod volumes;
