//! The unified hierarchy (cgroup v2): one leaf, controllers enabled down from the root.

use std::path::Path;

use brig_policy::Limits;

use super::fs;
use super::{
    cpu_quota_us, limit, mkdir_error, write_error, Builder, Controller, Hierarchy, Layout,
    V2Hierarchy, CPU_PERIOD_US,
};
use crate::JailError;

/// Makes the v2 leaf `<root>/<parent>/<name>`: enables the controllers brig takes from
/// v2 in `cgroup.subtree_control` of every cgroup from the root down to the parent
/// (writing only what is missing), creates the leaf and writes the limits.
pub(super) fn create(
    b: &mut Builder,
    layout: &Layout,
    v2: &V2Hierarchy,
    parent: Option<&Path>,
    name: &str,
    limits: &Limits,
) -> Result<(), JailError> {
    let base = b.ensure_parent(&v2.mount_point, parent)?;

    let mut wanted: Vec<Controller> = [Controller::Memory, Controller::Pids, Controller::Cpu]
        .into_iter()
        .filter(|&c| layout.source(c) == Some(Hierarchy::V2))
        .collect();
    let mut level = v2.mount_point.clone();
    wanted = enable(b, &level, wanted, limits)?;
    for component in parent.into_iter().flat_map(Path::components) {
        level.push(component);
        wanted = enable(b, &level, wanted, limits)?;
    }

    let leaf = base.join(name);
    b.make_leaf(&leaf).map_err(|err| mkdir_error(&leaf, &err))?;
    for &controller in &wanted {
        b.use_controller(controller, Hierarchy::V2, &leaf);
    }
    for controller in [Controller::Cpuacct, Controller::Freezer] {
        if layout.source(controller) == Some(Hierarchy::V2) {
            b.use_controller(controller, Hierarchy::V2, &leaf);
        }
    }

    // A controller with a limit is in `wanted` whenever it comes from v2 (else `enable` failed).
    let from_v2 = |c: Controller| wanted.contains(&c);
    if let Some(bytes) = limits.memory_bytes.filter(|_| from_v2(Controller::Memory)) {
        b.write(Controller::Memory, "memory.max", &bytes.to_string())?;
        if leaf.join("memory.swap.max").exists() {
            b.write(Controller::Memory, "memory.swap.max", "0")?;
        } else {
            b.note(
                "swap not limited: memory.swap.max is missing (kernel without swap accounting)"
                    .to_string(),
            );
        }
    }
    if let Some(pids) = limits.pids.filter(|_| from_v2(Controller::Pids)) {
        b.write(Controller::Pids, "pids.max", &pids.to_string())?;
    }
    if let Some(millis) = limits.cpus_millis.filter(|_| from_v2(Controller::Cpu)) {
        let value = format!("{} {CPU_PERIOD_US}", cpu_quota_us(u64::from(millis)));
        b.write(Controller::Cpu, "cpu.max", &value)?;
    }
    Ok(())
}

/// Makes sure `wanted` are enabled in `dir`'s `cgroup.subtree_control`; returns those
/// that are. A controller no limit needs is dropped (with a note) if it cannot be enabled.
fn enable(
    b: &mut Builder,
    dir: &Path,
    wanted: Vec<Controller>,
    limits: &Limits,
) -> Result<Vec<Controller>, JailError> {
    if wanted.is_empty() {
        return Ok(wanted);
    }
    let required = |c: Controller| limit(c, limits).is_some();
    let path = dir.join("cgroup.subtree_control");
    let current = match fs::read(&path) {
        Ok(text) => text,
        Err(err) => {
            let message = format!("cannot read {}: {err}; {}", path.display(), fs::hint(&err));
            if wanted.iter().any(|&c| required(c)) {
                return Err(JailError::Cgroup(message));
            }
            b.note(format!("v2 controllers not used: {message}"));
            return Ok(Vec::new());
        }
    };
    let enabled: Vec<&str> = current.split_whitespace().collect();
    let missing: Vec<Controller> = wanted
        .iter()
        .copied()
        .filter(|c| !enabled.contains(&c.name()))
        .collect();
    if missing.is_empty() {
        return Ok(wanted);
    }
    let line = missing
        .iter()
        .map(|c| format!("+{}", c.name()))
        .collect::<Vec<_>>()
        .join(" ");
    if fs::write(&path, &line).is_ok() {
        return Ok(wanted);
    }
    // One at a time, to know which one the kernel refuses.
    let mut kept = wanted;
    for controller in missing {
        let value = format!("+{}", controller.name());
        if let Err(err) = fs::write(&path, &value) {
            if required(controller) {
                return Err(write_error(&path, &value, &err));
            }
            b.note(format!(
                "{} not used: cannot write '{value}' to {}: {err}",
                controller.name(),
                path.display()
            ));
            kept.retain(|&c| c != controller);
        }
    }
    Ok(kept)
}

/// `oom_kill` of memory.events (Linux 4.13+).
pub(super) fn oom_kills(leaf: &Path) -> Option<u64> {
    fs::keyed_value(&fs::read(&leaf.join("memory.events")).ok()?, "oom_kill")
}

/// memory.peak (Linux 5.19+).
pub(super) fn memory_peak(leaf: &Path) -> Option<u64> {
    fs::single_value(&fs::read(&leaf.join("memory.peak")).ok()?)
}

pub(super) fn memory_now(leaf: &Path) -> Option<u64> {
    fs::single_value(&fs::read(&leaf.join("memory.current")).ok()?)
}

/// `usage_usec` of cpu.stat, in nanoseconds.
pub(super) fn cpu_time_ns(leaf: &Path) -> Option<u64> {
    fs::keyed_value(&fs::read(&leaf.join("cpu.stat")).ok()?, "usage_usec")
        .map(|usec| usec.saturating_mul(1000))
}
