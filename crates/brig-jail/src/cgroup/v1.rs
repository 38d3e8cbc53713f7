//! v1 hierarchies: one leaf per hierarchy used (memory, pids, cpu, cpuacct, freezer).

use std::io;
use std::path::Path;

use brig_policy::Limits;

use super::fs;
use super::{
    cpu_quota_us, limit, mkdir_error, Builder, Controller, Hierarchy, V1Hierarchy, CPU_PERIOD_US,
};
use crate::JailError;

/// The most a sandbox's TCP and UDP buffers may hold on cgroup v1: a fast
/// connection's buffers autotune to a few MiB, and the host's pool is shared.
const SOCKET_BUFFER_CAP: u64 = 64 << 20;

/// Makes the leaf of one hierarchy under the caller's own cgroup there (or under
/// `<mount>/<parent>`) and writes the limits of the `roles` it serves. A hierarchy no
/// limit needs is skipped, with a note, if its leaf cannot be made; a leaf that already
/// exists is always an error (it is not ours).
pub(super) fn create(
    b: &mut Builder,
    hierarchy: &V1Hierarchy,
    roles: &[Controller],
    parent: Option<&Path>,
    name: &str,
    limits: &Limits,
) -> Result<(), JailError> {
    let label = hierarchy.controllers.join(",");
    let required = roles.iter().any(|&c| limit(c, limits).is_some());
    let base = match parent {
        Some(_) => b.ensure_parent(&hierarchy.mount_point, parent),
        None => hierarchy.caller_dir.clone().ok_or_else(|| {
            JailError::Cgroup(format!(
                "brig's own {label} cgroup is outside the hierarchy mounted at {}: pass a cgroup parent",
                hierarchy.mount_point.display()
            ))
        }),
    };
    let base = match base {
        Ok(base) => base,
        Err(err) if !required => {
            b.note(format!("v1 {label} not used: {err}"));
            return Ok(());
        }
        Err(err) => return Err(err),
    };

    let leaf = base.join(name);
    if let Err(err) = b.make_leaf(&leaf) {
        let error = mkdir_error(&leaf, &err);
        if required || err.kind() == io::ErrorKind::AlreadyExists {
            return Err(error);
        }
        b.note(format!("v1 {label} not used: {error}"));
        return Ok(());
    }
    for &controller in roles {
        b.use_controller(controller, Hierarchy::V1, &leaf);
    }

    if roles.contains(&Controller::Memory) {
        if let Some(bytes) = limits.memory_bytes {
            let value = bytes.to_string();
            // The memory limit first: memsw may never be below it.
            b.write(Controller::Memory, "memory.limit_in_bytes", &value)?;
            if leaf.join("memory.memsw.limit_in_bytes").exists() {
                b.write(Controller::Memory, "memory.memsw.limit_in_bytes", &value)?;
            } else {
                b.note(
                    "swap not limited: memory.memsw.limit_in_bytes is missing (kernel without swap accounting, e.g. swapaccount=0)"
                        .to_string(),
                );
            }
            // v1 charges socket buffers to no one unless this is set (v2 charges
            // them to the memory limit): unread loopback TCP and UDP traffic took
            // 2.2 GB of host memory from a 64 MiB sandbox, and filled the host-wide
            // tcp_mem pool, so other sandboxes' connections were reset. Set, they
            // count against a counter of their own, so a sandbox holds at most its
            // memory limit plus this. It is capped apart from the memory limit: all
            // sandboxes share the host's pool (2.2 GB here), which one session of
            // 3 GiB could fill alone.
            if leaf.join("memory.kmem.tcp.limit_in_bytes").exists() {
                let tcp = bytes.min(SOCKET_BUFFER_CAP).to_string();
                b.write(Controller::Memory, "memory.kmem.tcp.limit_in_bytes", &tcp)?;
            } else {
                b.note(
                    "socket buffers not limited: memory.kmem.tcp.limit_in_bytes is missing"
                        .to_string(),
                );
            }
        }
    }
    if roles.contains(&Controller::Pids) {
        if let Some(pids) = limits.pids {
            b.write(Controller::Pids, "pids.max", &pids.to_string())?;
        }
    }
    if roles.contains(&Controller::Cpu) {
        if let Some(millis) = limits.cpus_millis {
            b.write(
                Controller::Cpu,
                "cpu.cfs_period_us",
                &CPU_PERIOD_US.to_string(),
            )?;
            let quota = cpu_quota_us(u64::from(millis)).to_string();
            b.write(Controller::Cpu, "cpu.cfs_quota_us", &quota)?;
        }
    }
    Ok(())
}

/// `oom_kill` of memory.oom_control (Linux 4.13+).
pub(super) fn oom_kills(leaf: &Path) -> Option<u64> {
    fs::keyed_value(
        &fs::read(&leaf.join("memory.oom_control")).ok()?,
        "oom_kill",
    )
}

pub(super) fn memory_peak(leaf: &Path) -> Option<u64> {
    fs::single_value(&fs::read(&leaf.join("memory.max_usage_in_bytes")).ok()?)
}

pub(super) fn memory_now(leaf: &Path) -> Option<u64> {
    fs::single_value(&fs::read(&leaf.join("memory.usage_in_bytes")).ok()?)
}

/// cpuacct.usage, already in nanoseconds.
pub(super) fn cpu_time_ns(leaf: &Path) -> Option<u64> {
    fs::single_value(&fs::read(&leaf.join("cpuacct.usage")).ok()?)
}
