//! Capabilities: the sandbox ends with none in any set.
//!
//! The child holds every capability of its own user namespace while it builds the
//! sandbox. Before the command runs it locks the securebits (so uid 0 inside gains
//! nothing at execve and uid changes cannot re-grant anything), empties the bounding
//! and ambient sets, then clears effective, permitted and inheritable.

use caps::CapSet;
use serde::Serialize;

use crate::sys::prctl;
use crate::{Context, JailError};

const SECBIT_NOROOT: libc::c_ulong = 1 << 0;
const SECBIT_NOROOT_LOCKED: libc::c_ulong = 1 << 1;
const SECBIT_NO_SETUID_FIXUP: libc::c_ulong = 1 << 2;
const SECBIT_NO_SETUID_FIXUP_LOCKED: libc::c_ulong = 1 << 3;
const SECBIT_KEEP_CAPS_LOCKED: libc::c_ulong = 1 << 5;
const SECBIT_NO_CAP_AMBIENT_RAISE: libc::c_ulong = 1 << 6;
const SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED: libc::c_ulong = 1 << 7;

/// Keeps capabilities across the setresuid that switches to the sandbox user, so the
/// child can still build mounts afterwards as that user (whose files it creates).
pub fn keep_across_setuid() -> Result<(), JailError> {
    prctl(libc::PR_SET_SECUREBITS, SECBIT_NO_SETUID_FIXUP).context(|| "set securebits".into())?;
    Ok(())
}

/// Drops every capability for good.
pub fn drop_all() -> Result<(), JailError> {
    let bits = SECBIT_NOROOT
        | SECBIT_NOROOT_LOCKED
        | SECBIT_NO_SETUID_FIXUP
        | SECBIT_NO_SETUID_FIXUP_LOCKED
        | SECBIT_KEEP_CAPS_LOCKED
        | SECBIT_NO_CAP_AMBIENT_RAISE
        | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED;
    prctl(libc::PR_SET_SECUREBITS, bits).context(|| "lock securebits".into())?;
    // Bounding first: dropping from it needs CAP_SETPCAP, which goes with the rest.
    // Every capability the running kernel knows, which may be more than this build's list.
    for cap in 0..64 {
        match prctl(libc::PR_CAPBSET_DROP, cap) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => break,
            Err(e) => {
                return Err(JailError::sys(
                    format!("drop capability {cap} from the bounding set"),
                    e,
                ))
            }
        }
    }
    caps::clear(None, CapSet::Ambient)
        .map_err(|e| JailError::Setup(format!("clear ambient capabilities: {e}")))?;
    caps::clear(None, CapSet::Inheritable)
        .map_err(|e| JailError::Setup(format!("clear inheritable capabilities: {e}")))?;
    caps::clear(None, CapSet::Effective)
        .map_err(|e| JailError::Setup(format!("clear effective capabilities: {e}")))?;
    caps::clear(None, CapSet::Permitted)
        .map_err(|e| JailError::Setup(format!("clear permitted capabilities: {e}")))?;
    Ok(())
}

/// Docker's default capability set: what package managers need as root (chown,
/// setuid to a sandbox user, mknod, ...). Kept only by build sandboxes, and only
/// within their own user namespace.
const BUILD_SET: &[caps::Capability] = &[
    caps::Capability::CAP_CHOWN,
    caps::Capability::CAP_DAC_OVERRIDE,
    caps::Capability::CAP_FOWNER,
    caps::Capability::CAP_FSETID,
    caps::Capability::CAP_KILL,
    caps::Capability::CAP_SETGID,
    caps::Capability::CAP_SETUID,
    caps::Capability::CAP_SETPCAP,
    caps::Capability::CAP_NET_BIND_SERVICE,
    caps::Capability::CAP_SYS_CHROOT,
    caps::Capability::CAP_MKNOD,
    caps::Capability::CAP_AUDIT_WRITE,
    caps::Capability::CAP_SETFCAP,
];

/// Limits every set to [`BUILD_SET`] (image builds: dpkg and apt run as root).
pub fn keep_build_set() -> Result<(), JailError> {
    // Undo keep_across_setuid's bit: root inside regains the set at execve.
    prctl(libc::PR_SET_SECUREBITS, 0).context(|| "reset securebits".into())?;
    let keep: caps::CapsHashSet = BUILD_SET.iter().copied().collect();
    for cap in caps::all() {
        if !keep.contains(&cap) {
            caps::drop(None, CapSet::Bounding, cap)
                .map_err(|e| JailError::Setup(format!("drop {cap} from the bounding set: {e}")))?;
        }
    }
    caps::clear(None, CapSet::Ambient)
        .map_err(|e| JailError::Setup(format!("clear ambient capabilities: {e}")))?;
    for set in [CapSet::Inheritable, CapSet::Effective, CapSet::Permitted] {
        caps::set(None, set, &keep)
            .map_err(|e| JailError::Setup(format!("limit {set:?} capabilities: {e}")))?;
    }
    Ok(())
}

/// What the kernel says about this process after the drop, read back rather than
/// assumed: /proc/self/status's capability masks and NoNewPrivs.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct CapsReport {
    pub effective: String,
    pub permitted: String,
    pub inheritable: String,
    pub bounding: String,
    pub ambient: String,
    pub no_new_privs: bool,
    pub all_dropped: bool,
}

pub fn read_back() -> Result<CapsReport, JailError> {
    let status =
        std::fs::read_to_string("/proc/self/status").context(|| "read /proc/self/status".into())?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
            .unwrap_or_default()
    };
    let mut report = CapsReport {
        effective: field("CapEff:"),
        permitted: field("CapPrm:"),
        inheritable: field("CapInh:"),
        bounding: field("CapBnd:"),
        ambient: field("CapAmb:"),
        no_new_privs: field("NoNewPrivs:") == "1",
        all_dropped: false,
    };
    let zero = |v: &str| !v.is_empty() && v.chars().all(|c| c == '0');
    report.all_dropped = [
        &report.effective,
        &report.permitted,
        &report.inheritable,
        &report.bounding,
        &report.ambient,
    ]
    .iter()
    .all(|v| zero(v));
    Ok(report)
}
