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
//! `oci-spec`'s `LinuxSeccomp`.
//!
//! `compile` turns it into classic BPF once per worker, for the init to install on itself
//! (`init/src/seccomp.rs`): handed the profile in `config.json`, runc compiles it through
//! libseccomp on every start, about half of a bare start's cost here. The compiler is
//! `seccompiler` (firecracker's): one program per action, since a program has one action on a
//! match (the allow-list with the profile's default errno, then one per other errno; the kernel
//! keeps the strictest answer, the newest among equal ones). Its filter is for the machine's
//! own ABI: a 32-bit (i386) system call kills the process and an x32 one gets the default
//! errno, where the runtime's would allow the profile's list for them too
//! (`OciConfig::seccomp_by_runtime` keeps the runtime's).

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
    /// the profile cannot be compiled to BPF here
    #[error("the seccomp profile cannot be compiled here: {0}")]
    Compile(String),
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

/// The profile as the init installs it: the filter file's bytes (`init/src/seccomp.rs`)
/// and how many system calls it names, for `arch` (`std::env::consts::ARCH`).
pub(crate) fn compile(profile: &LinuxSeccomp, arch: &str) -> Result<(Vec<u8>, usize), SeccompError> {
    use oci_spec::runtime::LinuxSeccompOperator as Op;
    use seccompiler::{
        BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
        TargetArch,
    };
    use std::collections::BTreeMap;
    let fail = |why: String| SeccompError::Compile(why);
    let (target, name_of): (TargetArch, fn(std::ffi::c_long) -> Option<&'static str>) = match arch {
        "x86_64" => (TargetArch::x86_64, syscall_numbers::x86_64::sys_call_name),
        "aarch64" => (TargetArch::aarch64, syscall_numbers::aarch64::sys_call_name),
        "riscv64" => (TargetArch::riscv64, syscall_numbers::riscv64::sys_call_name),
        other => return Err(fail(format!("no BPF compiler for {other}"))),
    };
    // Every number this ABI has, by name; a name the ABI lacks is skipped, as libseccomp does.
    let numbers: std::collections::HashMap<&str, i64> =
        (0..2048).filter_map(|n| name_of(n).map(|name| (name, i64::from(n as i32)))).collect();
    let errno = |a: LinuxSeccompAction, ret: Option<u32>| match a {
        LinuxSeccompAction::ScmpActErrno => Ok(ret.unwrap_or(nix::libc::EPERM as u32)),
        other => Err(fail(format!("the action {other:?} is not compiled here"))),
    };
    let default = errno(profile.default_action(), profile.default_errno_ret())?;
    // By the action on a match (`None`: allow), then by system call: the rules, OR'd; an empty
    // list matches unconditionally, and one unconditional rule makes the whole call so.
    let mut by_action: BTreeMap<Option<u32>, BTreeMap<i64, Option<Vec<SeccompRule>>>> = BTreeMap::new();
    let mut named = std::collections::BTreeSet::new();
    for rule in profile.syscalls().iter().flatten() {
        let action = match rule.action() {
            LinuxSeccompAction::ScmpActAllow => None,
            a => Some(errno(a, rule.errno_ret())?),
        };
        let conditions = rule
            .args()
            .iter()
            .flatten()
            .map(|a| {
                let op = match a.op() {
                    Op::ScmpCmpEq => SeccompCmpOp::Eq,
                    Op::ScmpCmpNe => SeccompCmpOp::Ne,
                    Op::ScmpCmpLt => SeccompCmpOp::Lt,
                    Op::ScmpCmpLe => SeccompCmpOp::Le,
                    Op::ScmpCmpGt => SeccompCmpOp::Gt,
                    Op::ScmpCmpGe => SeccompCmpOp::Ge,
                    // libseccomp's masked form: (arg & value) == valueTwo.
                    Op::ScmpCmpMaskedEq => SeccompCmpOp::MaskedEq(a.value()),
                };
                let value = match a.op() {
                    Op::ScmpCmpMaskedEq => a.value_two().unwrap_or(0),
                    _ => a.value(),
                };
                let index = u8::try_from(a.index()).map_err(|_| fail(format!("argument index {}", a.index())))?;
                // libseccomp compares whole 64-bit arguments.
                SeccompCondition::new(index, SeccompCmpArgLen::Qword, op, value).map_err(|e| fail(e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let matcher = match conditions.is_empty() {
            true => None,
            false => Some(SeccompRule::new(conditions).map_err(|e| fail(e.to_string()))?),
        };
        for name in rule.names() {
            let Some(&nr) = numbers.get(name.as_str()) else { continue };
            named.insert(nr);
            let slot = by_action.entry(action).or_default().entry(nr).or_insert_with(|| Some(Vec::new()));
            match (slot.as_mut(), &matcher) {
                (Some(rules), Some(m)) => rules.push(m.clone()),
                // Unconditional from now on.
                _ => *slot = None,
            }
        }
    }
    let program = |rules: BTreeMap<i64, Option<Vec<SeccompRule>>>, on_match, otherwise| {
        let rules = rules.into_iter().map(|(nr, r)| (nr, r.unwrap_or_default())).collect();
        SeccompFilter::new(rules, otherwise, on_match, target)
            .and_then(BpfProgram::try_from)
            .map_err(|e| fail(e.to_string()))
            .map(|p| {
                p.into_iter()
                    .map(|i| stevedore_init::seccomp::Insn { code: i.code, jt: i.jt, jf: i.jf, k: i.k })
                    .collect::<Vec<_>>()
            })
    };
    // The allow-list first; each errno after it, so its answer wins over the default errno.
    let mut programs = vec![program(
        by_action.remove(&None).unwrap_or_default(),
        SeccompAction::Allow,
        SeccompAction::Errno(default),
    )?];
    for (ret, rules) in by_action {
        let ret = ret.unwrap_or(default);
        programs.push(program(rules, SeccompAction::Errno(ret), SeccompAction::Allow)?);
    }
    Ok((stevedore_init::seccomp::encode(&programs), named.len()))
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

    /// Runs the installed programs as the kernel does (every one; the strictest answer, the
    /// newest among equals) on a system call of this ABI: a classic BPF interpreter for the
    /// instructions a seccomp filter uses.
    fn verdict(programs: &[Vec<stevedore_init::seccomp::Insn>], nr: u32, args: [u64; 6]) -> u32 {
        let data = |off: u32| -> u32 {
            match off {
                0 => nr,
                4 => 0xc000_003e, // AUDIT_ARCH_X86_64
                16..=63 => {
                    let a = args[((off - 16) / 8) as usize];
                    if (off - 16).is_multiple_of(8) { a as u32 } else { (a >> 32) as u32 }
                }
                _ => panic!("load at {off}"),
            }
        };
        let run = |p: &[stevedore_init::seccomp::Insn]| -> u32 {
            let (mut pc, mut acc) = (0usize, 0u32);
            loop {
                let i = p[pc];
                pc += 1;
                match i.code {
                    0x20 => acc = data(i.k),
                    0x54 => acc &= i.k,
                    0x05 => pc += i.k as usize,
                    0x06 => return i.k,
                    0x15 | 0x25 | 0x35 | 0x45 => {
                        let taken = match i.code {
                            0x15 => acc == i.k,
                            0x25 => acc > i.k,
                            0x35 => acc >= i.k,
                            _ => acc & i.k != 0,
                        };
                        pc += usize::from(if taken { i.jt } else { i.jf });
                    }
                    other => panic!("instruction {other:#x}"),
                }
            }
        };
        let action = |r: u32| (r & 0xffff_0000) as i32;
        let mut ret = 0x7fff_0000;
        for p in programs.iter().rev() {
            let r = run(p);
            if action(r) < action(ret) {
                ret = r;
            }
        }
        ret
    }

    #[test]
    fn the_compiled_filter_answers_as_the_profile_says() {
        let profile = for_attempt("x86_64", "6.1.0-18-amd64").unwrap();
        let (bytes, named) = compile(&profile, "x86_64").unwrap();
        let programs = stevedore_init::seccomp::decode(&bytes).unwrap();
        assert_eq!(programs.len(), 2, "the allow-list, then clone3's ENOSYS");
        assert!(named > 250, "{named} system calls named");
        let (allow, eperm, enosys) = (0x7fff_0000, 0x0005_0001, 0x0005_0026);
        let call = |nr: i64, args: [u64; 6]| verdict(&programs, nr as u32, args);
        use nix::libc::*;
        assert_eq!(call(SYS_read, [0; 6]), allow);
        assert_eq!(call(SYS_execve, [0; 6]), allow);
        assert_eq!(call(SYS_mount, [0; 6]), eperm);
        assert_eq!(call(SYS_unshare, [0; 6]), eperm);
        assert_eq!(call(SYS_keyctl, [0; 6]), eperm);
        assert_eq!(call(SYS_clone3, [0; 6]), enosys, "ENOSYS, so the C library falls back to clone");
        assert_eq!(call(SYS_clone, [(SIGCHLD as u64) | CLONE_VM as u64, 0, 0, 0, 0, 0]), allow);
        assert_eq!(call(SYS_clone, [CLONE_NEWNS as u64, 0, 0, 0, 0, 0]), eperm, "no namespace flags");
        assert_eq!(call(SYS_clone, [CLONE_NEWUSER as u64 | (1 << 40), 0, 0, 0, 0, 0]), eperm);
        assert_eq!(call(SYS_personality, [8, 0, 0, 0, 0, 0]), allow);
        assert_eq!(call(SYS_personality, [0xffff_ffff, 0, 0, 0, 0, 0]), allow);
        assert_eq!(call(SYS_personality, [1, 0, 0, 0, 0, 0]), eperm);
        assert_eq!(call(SYS_personality, [8 | (1 << 32), 0, 0, 0, 0, 0]), eperm, "whole 64-bit arguments");
        assert_eq!(call(SYS_read | 0x4000_0000, [0; 6]), eperm, "an x32 call");
        assert!(matches!(compile(&profile, "sparc"), Err(SeccompError::Compile(_))));
    }
}
