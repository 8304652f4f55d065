//! Phase 1 of a process-rung attempt: what is decided before anything exists on the host:
//! the argv, the limits (the one rule, `contract::limits::resolve`), the names, the uid the
//! command runs as, its environment. Pure but for the output dir, opened once, and the input
//! dir, opened and measured (too large: refused before a uid is leased or a dir made).

use super::config::ProcessConfig;
use super::dirs::AttemptDir;
use crate::attempt::Decided;
use crate::contract::limits::{self, Applied, Limits, RungLimits};
use crate::contract::{InputsStaged, LaunchError, Request, Task};
use crate::inputs::InputDir;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use stevedore_init::wire::{HANDLER_MARKER, env as wire_env};

/// What the process rung cannot enforce, whatever the host (memory, CPU and pids need a
/// cgroup, known only once one is made; disk is never enforced: both are `enforcement`'s).
const CANNOT: &[(&str, &str)] = &[
    ("gpu", "the process rung has no GPU isolation"),
    ("nofile", "set it for every command with the rung's `rlimits`"),
];

/// What the attempt will do, decided.
#[derive(Debug)]
pub(crate) struct Plan {
    /// What every rung decides (the name names the attempt's dir, cgroup and captures; the
    /// environment and working directory name the dir, and are set once it exists:
    /// `provision`).
    pub decided: Decided,
    pub limits: Applied,
    /// The inputs, opened and measured (refused above the limit before anything is made).
    pub inputs: Option<(InputDir, InputsStaged)>,
}

/// The plan of `req`; `worker_exe` gives the installed worker binary a handler runs.
pub(crate) fn prepare(
    req: &Request,
    cfg: &ProcessConfig,
    worker_exe: impl FnOnce() -> Result<PathBuf, LaunchError>,
) -> Result<Plan, LaunchError> {
    let started_ms = crate::contract::unix_ms_now();
    let output_dir = req.open_output_dir()?;
    let argv = match &req.task {
        Task::Command(argv) => argv.clone(),
        Task::Handler(_) => vec![worker_exe()?.display().to_string(), HANDLER_MARKER.to_owned()],
    };
    let inputs = crate::inputs::opened(req.input_dir.as_deref(), cfg.max_input_bytes)?;
    let mut decided = Decided::new(started_ms, output_dir, argv, |id| super::reclaim::attempt_name(&req.worker_id, id));
    let limits = resolve(req, cfg);
    decided.narrowed.clone_from(&limits.narrowed);
    Ok(Plan { decided, limits, inputs })
}

/// The request's limits on this rung.
pub(crate) fn resolve(req: &Request, cfg: &ProcessConfig) -> Applied {
    // Nothing by default: without a cgroup nothing could hold a limit anyway.
    let rung = RungLimits { defaults: &cfg.defaults, ceilings: &cfg.ceilings, fallback: &Limits::NONE, cannot: CANNOT };
    limits::resolve(&req.limits, rung)
}

/// Who the command runs as: the leased uid, the configured one, or (`None`) the worker's.
pub(crate) fn identity(cfg: &ProcessConfig, leased: Option<u32>, euid: u32) -> Option<(u32, u32)> {
    match (leased, cfg.run_as) {
        (Some(uid), None) if cfg.uids.is_some() => Some((uid, uid)),
        (_, Some((u, g))) if u != euid => Some((u, g)),
        _ => None,
    }
}

/// The command's whole environment: the allowlist, then the request's, then stevedore's
/// own (later ones win).
pub(crate) fn env(cfg: &ProcessConfig, req: &Request, dir: &AttemptDir, init: &Path) -> Vec<(String, String)> {
    let tmp = dir.tmp.display().to_string();
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    env.insert("PATH".into(), cfg.path.clone());
    env.insert("HOME".into(), tmp.clone());
    env.insert("TMPDIR".into(), tmp);
    env.extend(req.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    env.insert(wire_env::JOB_ID.into(), req.job_id.clone());
    env.insert(wire_env::ATTEMPT.into(), req.attempt.to_string());
    env.insert(wire_env::IN.into(), dir.input.display().to_string());
    env.insert(wire_env::OUT.into(), dir.output.display().to_string());
    env.insert(wire_env::INIT.into(), init.display().to_string());
    env.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::ResourceLimits;

    fn dir() -> AttemptDir {
        let root = PathBuf::from("/run/a/w-1");
        AttemptDir { input: root.join("in"), output: root.join("out"), tmp: root.join("tmp"), root }
    }

    #[test]
    fn stevedore_s_variables_win_over_the_request_s() {
        let mut req = Request::command("j", ["true"], "/tmp/o").attempt(3);
        req.env.insert("HOME".into(), "/elsewhere".into());
        req.env.insert(wire_env::OUT.into(), "/forged".into());
        req.env.insert("A".into(), "1".into());
        let env: BTreeMap<_, _> =
            env(&ProcessConfig::default(), &req, &dir(), Path::new("/bin/init")).into_iter().collect();
        assert_eq!(env["HOME"], "/elsewhere", "the request may move HOME");
        assert_eq!(env[wire_env::OUT], "/run/a/w-1/out", "but never the protocol's");
        assert_eq!(env[wire_env::ATTEMPT], "3");
        assert_eq!(env["TMPDIR"], "/run/a/w-1/tmp");
        assert_eq!(env["A"], "1");
        assert_eq!(env.len(), 9, "nothing of the worker's own environment: {env:?}");
    }

    #[test]
    fn the_command_runs_as_the_lease_or_the_configured_uid() {
        let mut cfg = ProcessConfig { run_as: Some((1000, 1000)), ..ProcessConfig::default() };
        assert_eq!(identity(&cfg, None, 0), Some((1000, 1000)));
        assert_eq!(identity(&cfg, None, 1000), None, "the worker's own uid");
        cfg.run_as = None;
        cfg.uids = Some(crate::process::UidRange { first: 0x6000_0000, count: 4 });
        assert_eq!(identity(&cfg, Some(0x6000_0002), 0), Some((0x6000_0002, 0x6000_0002)));
    }

    #[test]
    fn a_ceiling_only_narrows_on_this_rung_too() {
        let cfg = ProcessConfig::default().ceilings(Limits::NONE.memory(64 << 20)).defaults(Limits::NONE.pids(50));
        let req = Request::command("j", ["true"], "/tmp/o");
        let a = resolve(&req, &cfg);
        assert_eq!((a.limits.memory_bytes, a.limits.pids), (None, Some(50)), "nothing asked: no memory limit");
        let req = req.limits(ResourceLimits::new().with("memory", 1 << 30).with("gpu", 1000));
        let a = resolve(&req, &cfg);
        assert_eq!(a.limits.memory_bytes, Some(64 << 20));
        assert_eq!(a.narrowed.len(), 1);
        assert!(a.skipped["gpu"].contains("no GPU"), "{a:?}");
    }
}
