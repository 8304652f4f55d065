//! PID 1 giving up root: where the rung starts the init as uid 0 (the container rung, to write
//! the inputs it is sent over the link into a staging mount as root's entries, `stage`), the
//! init holds only `SETUID`, `SETGID` and `SETPCAP`, and drops itself to the sandbox's user
//! before it forks the command and before it reads anything the command could write:
//! bounding set emptied, supplementary groups set to the rung's list (never the image's
//! files), gid then uid set (real, effective and saved), inheritable and ambient sets
//! cleared, `no_new_privs`, and non-dumpable again (a credential change resets it, and the
//! link key must stay out of the command's reach). What the kernel then says of it
//! (`/proc/self/status`) goes into the record.

use crate::wire::{Credentials, CredentialsSeen};
use nix::unistd::{Gid, Uid, setgroups, setresgid, setresuid};
use rustix::thread::{
    CapabilitySet, CapabilitySets, clear_ambient_capability_set, remove_capability_from_bounding_set,
};

/// The highest capability the kernel knows (`/proc/sys/kernel/cap_last_cap`), or every bit
/// rustix can name when that cannot be read.
fn last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(63)
        .min(63)
}

/// Drops every privilege of this process for `to`'s; an error leaves the process as it is
/// (the caller runs no command then).
pub(crate) fn drop_to(to: &Credentials) -> Result<(), String> {
    if to.uid == 0 || to.gid == 0 {
        return Err("the credentials to drop to are root's".into());
    }
    for cap in 0..=last_cap() {
        // A capability the kernel does not have is EINVAL: past the last, nothing is left.
        match remove_capability_from_bounding_set(CapabilitySet::from_bits_retain(1 << cap)) {
            Ok(()) | Err(rustix::io::Errno::INVAL) => {}
            Err(e) => return Err(format!("emptying the bounding set (capability {cap}): {e}")),
        }
    }
    let groups: Vec<Gid> = to.groups.iter().map(|&g| Gid::from_raw(g)).collect();
    setgroups(&groups).map_err(|e| format!("setgroups {:?}: {e}", to.groups))?;
    let gid = Gid::from_raw(to.gid);
    setresgid(gid, gid, gid).map_err(|e| format!("setresgid {}: {e}", to.gid))?;
    let uid = Uid::from_raw(to.uid);
    // Without SECBIT_KEEP_CAPS, leaving uid 0 clears the permitted and effective sets.
    setresuid(uid, uid, uid).map_err(|e| format!("setresuid {}: {e}", to.uid))?;
    let none = CapabilitySets {
        effective: CapabilitySet::empty(),
        permitted: CapabilitySet::empty(),
        inheritable: CapabilitySet::empty(),
    };
    rustix::thread::set_capabilities(None, none).map_err(|e| format!("clearing the capability sets: {e}"))?;
    clear_ambient_capability_set().map_err(|e| format!("clearing the ambient set: {e}"))?;
    rustix::thread::set_no_new_privs(true).map_err(|e| format!("no_new_privs: {e}"))?;
    nix::sys::prctl::set_dumpable(false).map_err(|e| format!("making the init non-dumpable again: {e}"))?;
    let r = nix::unistd::getresuid().map_err(|e| format!("getresuid: {e}"))?;
    if [r.real, r.effective, r.saved].iter().any(|u| u.as_raw() != to.uid) {
        return Err(format!("the uid did not change: {r:?}"));
    }
    Ok(())
}

/// What the kernel says of this process's credentials now (`/proc/self/status`), and whether
/// it is dumpable.
pub(crate) fn seen() -> CredentialsSeen {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':')))
            .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
            .unwrap_or_default()
    };
    CredentialsSeen {
        uid: field("Uid"),
        gid: field("Gid"),
        groups: field("Groups"),
        cap_inh: field("CapInh"),
        cap_prm: field("CapPrm"),
        cap_eff: field("CapEff"),
        cap_bnd: field("CapBnd"),
        cap_amb: field("CapAmb"),
        no_new_privs: field("NoNewPrivs"),
        seccomp: field("Seccomp"),
        dumpable: nix::sys::prctl::get_dumpable().unwrap_or(true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_never_a_target_and_the_status_is_read() {
        let root = Credentials { uid: 0, gid: 0, groups: Vec::new() };
        assert!(drop_to(&root).unwrap_err().contains("root"));
        let s = seen();
        assert!(!s.uid.is_empty() && s.cap_bnd.len() == 16, "{s:?}");
    }
}
