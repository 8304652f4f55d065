//! Docker's default seccomp profile, for the oci rung's attempts (pure).
//!
//! The profile is vendored as data: `docker-seccomp-default.json` beside this file is
//! `profiles/seccomp/default.json` of Docker 20.10.24 (moby, Apache-2.0, Copyright Docker,
//! Inc.), as Debian ships it in `golang-github-docker-docker-dev` 20.10.24+dfsg1-1+deb12u1
//! (sha256 `e5e91f88…55cf61`), the engine version on this project's machines. It is in
//! Docker's own format: rules apply or not by the architecture, the capabilities the
//! container holds and the kernel's version. `for_attempt` resolves them as the engine does
//! for a container with no capabilities (the oci rung's command holds none): a rule that
//! needs a capability is left out, a rule a capability would exclude is kept. The result is
//! `oci-spec`'s `LinuxSeccomp`, which the spec carries.

use oci_spec::runtime::{Arch, LinuxSeccomp, LinuxSeccompAction, LinuxSyscall};
use serde::Deserialize;

/// The vendored profile.
const PROFILE: &str = include_str!("docker-seccomp-default.json");
/// Where it is from, for the evidence.
pub(crate) const ORIGIN: &str = "Docker's default seccomp profile (moby 20.10.24, vendored)";

/// Why the profile cannot be used here.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SeccompError {
    /// the vendored profile does not parse
    #[error("the vendored seccomp profile does not parse")]
    Parse(#[source] serde_json::Error),
    /// this machine's architecture is not in the profile
    #[error("the seccomp profile has no architecture {0}")]
    Arch(String),
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Profile {
    default_action: LinuxSeccompAction,
    #[serde(default)]
    default_errno_ret: Option<u32>,
    arch_map: Vec<ArchEntry>,
    syscalls: Vec<Rule>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ArchEntry {
    architecture: Arch,
    #[serde(default)]
    sub_architectures: Vec<Arch>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Rule {
    names: Vec<String>,
    action: LinuxSeccompAction,
    #[serde(default)]
    errno_ret: Option<u32>,
    #[serde(default)]
    args: Option<Vec<oci_spec::runtime::LinuxSeccompArg>>,
    #[serde(default)]
    includes: Filter,
    #[serde(default)]
    excludes: Filter,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Filter {
    #[serde(default)]
    caps: Vec<String>,
    #[serde(default)]
    arches: Vec<String>,
    #[serde(default)]
    min_kernel: Option<String>,
}

/// This machine's architecture: the profile's word for it in `includes`/`excludes` (Go's),
/// and its seccomp architecture.
fn native(arch: &str) -> Option<(&'static str, Arch)> {
    Some(match arch {
        "x86_64" => ("amd64", Arch::ScmpArchX86_64),
        "aarch64" => ("arm64", Arch::ScmpArchAarch64),
        "s390x" => ("s390x", Arch::ScmpArchS390x),
        "riscv64" => ("riscv64", Arch::ScmpArchRiscv64),
        _ => return None,
    })
}

/// `major.minor` of a kernel release (`6.1.0-18-amd64` → (6, 1)).
fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(|c: char| !c.is_ascii_digit()).filter(|s| !s.is_empty());
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// The profile for a command with no capabilities on `arch` (`std::env::consts::ARCH`) and
/// the kernel `release`.
pub(crate) fn for_attempt(arch: &str, release: &str) -> Result<LinuxSeccomp, SeccompError> {
    let p: Profile = serde_json::from_str(PROFILE).map_err(SeccompError::Parse)?;
    let (go_arch, scmp) = native(arch).ok_or_else(|| SeccompError::Arch(arch.to_owned()))?;
    let entry =
        p.arch_map.iter().find(|a| a.architecture == scmp).ok_or_else(|| SeccompError::Arch(arch.to_owned()))?;
    let mut arches = vec![entry.architecture];
    arches.extend(entry.sub_architectures.iter().copied());
    let kernel = kernel_version(release);
    let applies = |r: &Rule| {
        if r.excludes.arches.iter().any(|a| a == go_arch) {
            return false;
        }
        // No capabilities held: a rule a capability would exclude stays, one that needs one goes.
        if !r.includes.caps.is_empty() {
            return false;
        }
        if !r.includes.arches.is_empty() && !r.includes.arches.iter().any(|a| a == go_arch) {
            return false;
        }
        match (&r.includes.min_kernel, kernel) {
            (Some(min), Some(have)) => kernel_version(min).is_none_or(|min| have >= min),
            // A kernel whose version cannot be read gets only the rules that need none.
            (Some(_), None) => false,
            (None, _) => true,
        }
    };
    let syscalls = p
        .syscalls
        .into_iter()
        .filter(|r| applies(r))
        .map(|r| {
            let mut s = LinuxSyscall::default();
            s.set_names(r.names);
            s.set_action(r.action);
            s.set_errno_ret(r.errno_ret);
            s.set_args(r.args);
            s
        })
        .collect();
    let mut out = LinuxSeccomp::default();
    out.set_default_action(p.default_action);
    out.set_default_errno_ret(p.default_errno_ret);
    out.set_architectures(Some(arches));
    out.set_syscalls(Some(syscalls));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(s: &LinuxSeccomp, action: LinuxSeccompAction) -> Vec<String> {
        s.syscalls().iter().flatten().filter(|r| r.action() == action).flat_map(|r| r.names().iter().cloned()).collect()
    }

    #[test]
    fn a_command_without_capabilities_gets_the_engine_s_rules_for_its_architecture() {
        let s = for_attempt("x86_64", "6.1.0-18-amd64").unwrap();
        assert_eq!(s.default_action(), LinuxSeccompAction::ScmpActErrno);
        assert_eq!(
            s.architectures().as_deref(),
            Some(&[Arch::ScmpArchX86_64, Arch::ScmpArchX86, Arch::ScmpArchX32][..])
        );
        let allowed = names(&s, LinuxSeccompAction::ScmpActAllow);
        for call in ["read", "write", "execve", "clone", "personality", "arch_prctl"] {
            assert!(allowed.iter().any(|n| n == call), "{call} allowed");
        }
        // Only with CAP_SYS_ADMIN (and the like) in Docker's profile: never here.
        for call in ["mount", "unshare", "setns", "bpf", "keyctl", "add_key", "process_vm_readv", "reboot"] {
            assert!(!allowed.iter().any(|n| n == call), "{call} must not be allowed");
        }
        // clone only without namespace flags (the masked argument rule), and not the s390 form.
        let clones: Vec<_> =
            s.syscalls().iter().flatten().filter(|r| r.names().contains(&"clone".to_owned())).collect();
        assert_eq!(clones.len(), 1);
        assert_eq!(clones[0].args().as_ref().map(|a| a[0].index()), Some(0));
        let enosys: Vec<_> =
            s.syscalls().iter().flatten().filter(|r| r.names().contains(&"clone3".to_owned())).collect();
        assert_eq!(enosys.iter().map(|r| r.errno_ret()).collect::<Vec<_>>(), [Some(38)], "clone3 is ENOSYS on x86_64");
    }

    #[test]
    fn an_unknown_architecture_is_refused_and_an_old_kernel_loses_newer_rules() {
        assert!(matches!(for_attempt("sparc", "6.1"), Err(SeccompError::Arch(_))));
        let old = for_attempt("x86_64", "4.4.0").unwrap();
        let new = for_attempt("x86_64", "6.1.0").unwrap();
        let count = |s: &LinuxSeccomp| s.syscalls().as_ref().map_or(0, Vec::len);
        assert!(count(&old) < count(&new), "minKernel rules only on a newer kernel");
        let allowed =
            |s: &LinuxSeccomp, call: &str| names(s, LinuxSeccompAction::ScmpActAllow).iter().any(|n| n == call);
        assert!(allowed(&new, "ptrace") && !allowed(&old, "ptrace"), "ptrace from 4.8 on, as the engine does");
    }
}
