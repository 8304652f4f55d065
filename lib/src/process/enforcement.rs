//! What the process rung enforces for one attempt, and what it does not, as the evidence
//! says it (pure: from the configuration, the limits, the cgroup made or not, the uid).

use super::cgroup::Cgroup;
use super::config::ProcessConfig;
use crate::contract::Limits;
use std::collections::BTreeMap;
use stevedore_init::wire::RlimitResource;

/// What the rung is, as far as the evidence needs it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seen<'a> {
    pub config: &'a ProcessConfig,
    /// The worker's uid.
    pub euid: u32,
    /// Whether the rung leases uids (one attempt at a time per uid).
    pub leased: bool,
}

/// Entries of the evidence: what is enforced (`enforcement`), what is not (`skipped`).
type Entries = BTreeMap<String, String>;

/// What the process rung enforces, and what it does not, for the evidence.
pub(crate) fn enforcement(
    site: Seen<'_>,
    applied: &Limits,
    cg: &Result<Option<Cgroup>, String>,
    inputs_sealed: Option<bool>,
    identity: Option<(u32, u32)>,
) -> (Entries, Entries) {
    let mut on = BTreeMap::new();
    let mut off = BTreeMap::new();
    who(site, identity, &mut on, &mut off);
    on.insert("session".into(), "own session and process group; SIGTERM, grace, SIGKILL; stragglers killed".into());
    on.insert("env".into(), "the request's variables plus PATH, HOME and TMPDIR only".into());
    rlimits(site.config, &mut on);
    limits(applied, cg, &mut on, &mut off);
    off.insert("disk".into(), "no mount enforces it: outputs go to a directory on the host's filesystem".into());
    off.insert("network".into(), "the process rung shares the host's network".into());
    match inputs_sealed {
        Some(true) => {
            on.insert("inputs".into(), "a private copy, read-only (owned by the worker, not the command's uid)".into());
        }
        Some(false) => {
            off.insert(
                "inputs.read_only".into(),
                "a private copy owned by the command's own uid: it can make it writable again".into(),
            );
        }
        None => {}
    }
    (on, off)
}

/// The uid the command runs as, and who else may have it.
fn who(site: Seen<'_>, identity: Option<(u32, u32)>, on: &mut Entries, off: &mut Entries) {
    let cfg = site.config;
    match identity {
        Some((u, g)) if cfg.uids.is_some() => {
            on.insert(
                "uid".into(),
                format!("uid {u} gid {g} of the attempt's own, not the worker's uid {}", site.euid),
            );
            on.insert(
                "between_attempts".into(),
                format!(
                    "no other attempt has uid {u} while anything of it is left (range {}): none can signal, ptrace or \
                     read the other's /proc entries or files; its processes, its files in /tmp, /var/tmp and /dev/shm \
                     and its IPC objects are swept when it ends",
                    cfg.uids.map(|r| r.to_string()).unwrap_or_default()
                ),
            );
        }
        Some((u, g)) => {
            on.insert("uid".into(), format!("uid {u} gid {g}, not the worker's uid {}", site.euid));
        }
        None => {
            off.insert(
                "uid".into(),
                format!(
                    "the worker's own uid {} (allowed by configuration): it can read the worker's files",
                    site.euid
                ),
            );
        }
    }
    if cfg.uids.is_none() {
        let shared_uid = identity.map_or(site.euid, |(u, _)| u);
        if !site.leased {
            off.insert(
                "between_attempts".into(),
                format!(
                    "attempts run side by side as uid {shared_uid} (allowed by configuration): they can signal, \
                     ptrace and read each other"
                ),
            );
        } else {
            on.insert(
                "between_attempts".into(),
                format!(
                    "one attempt at a time as uid {shared_uid}; what one leaves in the host's shared dirs is not swept \
                     (the uid is not the rung's own)"
                ),
            );
        }
    }
}

/// The rlimits every command gets.
fn rlimits(cfg: &ProcessConfig, on: &mut Entries) {
    for l in &cfg.rlimits {
        let (name, what) = match l.resource {
            RlimitResource::Nofile => ("nofile", "open files per process".to_owned()),
            RlimitResource::Nproc => ("nproc", "processes of the attempt's uid in all".into()),
            RlimitResource::Core => ("core", "largest core dump, bytes".into()),
            RlimitResource::Cpu => ("cpu", "CPU seconds per process, in total (not a rate)".into()),
            RlimitResource::Fsize => ("fsize", "largest file written, bytes".into()),
        };
        on.insert(format!("rlimit.{name}"), format!("{} soft, {} hard: {what}", l.soft, l.hard));
    }
}

/// Memory, CPU and pids: in the attempt's cgroup, or not enforced.
fn limits(applied: &Limits, cg: &Result<Option<Cgroup>, String>, on: &mut Entries, off: &mut Entries) {
    match cg {
        Ok(Some(c)) => {
            let where_ = c.describe();
            if let Some(m) = applied.memory_bytes {
                on.insert("memory".into(), format!("{m} bytes, swap off ({where_})"));
            }
            if let Some(m) = applied.cpu_millis {
                on.insert("cpu".into(), format!("{} cores of CPU time per period ({where_})", m as f64 / 1000.0));
            }
            if let Some(p) = applied.pids {
                on.insert("pids".into(), format!("{p} ({where_})"));
            }
        }
        other => {
            let why = match other {
                Err(e) => format!("no cgroup could be made ({e}): not enforced"),
                _ => "no cgroup is delegated to stevedore: not enforced".into(),
            };
            if applied.memory_bytes.is_some() {
                off.insert("memory".into(), format!("{why} (RLIMIT_AS is not a memory limit)"));
            }
            if applied.cpu_millis.is_some() {
                off.insert("cpu".into(), why.clone());
            }
            if applied.pids.is_some() {
                off.insert("pids".into(), format!("{why} (RLIMIT_NPROC counts every process of the uid)"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::UidRange;

    fn seen(config: &ProcessConfig, leased: bool) -> Seen<'_> {
        Seen { config, euid: 0, leased }
    }

    #[test]
    fn limits_without_a_cgroup_are_said_not_to_be_enforced() {
        let cfg = ProcessConfig::default();
        let limits = Limits::NONE.memory(64 << 20).pids(10);
        let (on, off) = enforcement(seen(&cfg, true), &limits, &Ok(None), None, Some((1000, 1000)));
        assert!(off["memory"].contains("not enforced") && off["pids"].contains("not enforced"), "{off:?}");
        assert!(!on.contains_key("memory") && !off.contains_key("cpu"), "only what was asked: {on:?} {off:?}");
        assert!(off["disk"].contains("no mount") && off["network"].contains("host's network"));
    }

    #[test]
    fn a_cgroup_enforces_what_was_asked_and_names_itself() {
        let cfg = ProcessConfig::default();
        let cg = Cgroup::V2("/sys/fs/cgroup/stevedore/a1".into());
        let (on, _) = enforcement(seen(&cfg, true), &Limits::NONE.cpu(500), &Ok(Some(cg)), Some(true), None);
        assert!(on["cpu"].contains("0.5 cores") && on["cpu"].contains("cgroup v2"), "{on:?}");
        assert!(on["inputs"].contains("read-only"));
    }

    #[test]
    fn the_uid_says_who_else_shares_it() {
        let mut cfg = ProcessConfig { uids: None, ..ProcessConfig::default() };
        let (_, off) = enforcement(seen(&cfg, false), &Limits::NONE, &Ok(None), None, Some((1000, 1000)));
        assert!(off["between_attempts"].contains("side by side"), "{off:?}");
        let (on, _) = enforcement(seen(&cfg, true), &Limits::NONE, &Ok(None), None, Some((1000, 1000)));
        assert!(on["between_attempts"].contains("one attempt at a time"), "{on:?}");
        cfg.uids = Some(UidRange { first: 0x6000_0000, count: 16 });
        let (on, _) = enforcement(seen(&cfg, true), &Limits::NONE, &Ok(None), None, Some((0x6000_0001, 0x6000_0001)));
        assert!(on["uid"].contains("of the attempt's own") && on["between_attempts"].contains("swept"), "{on:?}");
    }
}
