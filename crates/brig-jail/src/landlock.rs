//! Landlock: the sandbox may write only below its writable mounts.
//!
//! Mount flags already make everything else read-only; Landlock is the second,
//! independent wall (it also covers what mount flags cannot, such as writes to
//! /proc files a process owns). The ABI is detected at run time: every access right
//! the kernel knows is handled, so "fully enforced" means "as strict as this kernel
//! can be", and the report says which ABI that was.

use ::landlock::{
    path_beneath_rules, Access, AccessFs, CompatLevel, Compatible, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};
use brig_policy::LandlockMode;
use serde::{Deserialize, Serialize};

use crate::JailError;

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct LandlockReport {
    /// "fully_enforced", "partially_enforced", "not_enforced" or "off".
    pub status: String,
    /// The kernel's Landlock ABI (None if the kernel has no Landlock).
    pub kernel_abi: Option<u32>,
    /// The ABI whose access rights brig asked for.
    pub abi_used: Option<u32>,
    pub reason: Option<String>,
}

const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;

/// The kernel's Landlock ABI version, or why there is none.
pub fn kernel_abi() -> Result<u32, String> {
    // SAFETY: with a NULL attribute pointer, size 0 and the VERSION flag the call only
    // returns the ABI version number; no memory is read or written.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if ret < 0 {
        let err = std::io::Error::last_os_error();
        return Err(match err.raw_os_error() {
            Some(libc::ENOSYS) => "the kernel is built without Landlock".to_string(),
            Some(libc::EOPNOTSUPP) => {
                "Landlock is disabled on this kernel (lsm= boot parameter)".to_string()
            }
            _ => format!("Landlock is unavailable: {err}"),
        });
    }
    Ok(ret as u32)
}

fn abi_from(version: u32) -> ABI {
    ABI::from(version.min(i32::MAX as u32) as i32)
}

/// Restricts the calling process (and everything it starts). Call after no_new_privs.
pub fn restrict(
    mode: LandlockMode,
    writable: &[String],
    devices: &[String],
) -> Result<LandlockReport, JailError> {
    if mode == LandlockMode::Off {
        return Ok(LandlockReport {
            status: "off".into(),
            reason: Some("disabled with --landlock off".into()),
            ..Default::default()
        });
    }
    let version = match kernel_abi() {
        Ok(v) => v,
        Err(reason) if mode == LandlockMode::Required => {
            return Err(JailError::LandlockRequired(reason))
        }
        Err(reason) => {
            return Ok(LandlockReport {
                status: "not_enforced".into(),
                reason: Some(reason),
                ..Default::default()
            })
        }
    };
    let abi = abi_from(version);
    let level = if mode == LandlockMode::Required {
        CompatLevel::HardRequirement
    } else {
        CompatLevel::BestEffort
    };
    let fail = |e: &dyn std::fmt::Display| match mode {
        LandlockMode::Required => JailError::LandlockRequired(e.to_string()),
        _ => JailError::Setup(format!("landlock: {e}")),
    };
    let read = AccessFs::from_read(abi);
    let device = AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::IoctlDev;
    let mut ruleset = Ruleset::default()
        .set_compatibility(level)
        .handle_access(AccessFs::from_all(abi))
        .map_err(|e| fail(&e))?;
    if version >= 6 {
        // Signals and abstract unix sockets stay inside the sandbox's own domain.
        ruleset = ruleset
            .scope(Scope::AbstractUnixSocket | Scope::Signal)
            .map_err(|e| fail(&e))?;
    }
    let status = ruleset
        .create()
        .map_err(|e| fail(&e))?
        .set_compatibility(CompatLevel::BestEffort)
        .add_rules(path_beneath_rules(["/"], read))
        .map_err(|e| fail(&e))?
        .add_rules(path_beneath_rules(writable, AccessFs::from_all(abi)))
        .map_err(|e| fail(&e))?
        .add_rules(path_beneath_rules(devices, device | read))
        .map_err(|e| fail(&e))?
        .restrict_self()
        .map_err(|e| fail(&e))?;
    let status_name = match status.ruleset {
        RulesetStatus::FullyEnforced => "fully_enforced",
        RulesetStatus::PartiallyEnforced => "partially_enforced",
        RulesetStatus::NotEnforced => "not_enforced",
    };
    if mode == LandlockMode::Required && status.ruleset != RulesetStatus::FullyEnforced {
        return Err(JailError::LandlockRequired(format!(
            "the kernel enforced it only partially ({status_name})"
        )));
    }
    Ok(LandlockReport {
        status: status_name.into(),
        kernel_abi: Some(version),
        abi_used: Some(version.min(abi as u32)),
        reason: None,
    })
}
