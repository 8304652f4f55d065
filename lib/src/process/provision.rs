//! Phase 2 of a process-rung attempt: the uid's lease, the attempt's dir with a private
//! copy of the inputs, its cgroup when one is delegated, and stevedore's init spawned as
//! the command's uid with the link on its stdin/stdout and its takeover socket on fd 3.
//! Everything is in the attempt's `Cleanup` as soon as it exists.

use super::cgroup;
use super::cleanup::Cleanup;
use super::dirs::AttemptDir;
use super::enforcement::{Seen, enforcement};
use super::ledger::Own;
use super::prepare::{self, Plan};
use super::site::ProcessSite;
use super::tree::{PID_FILE, start_ticks};
use crate::attempt::{Layout, Provisioned};
use crate::contract::{InputsStaged, LaunchError, Request};
use crate::inputs::{InputDir, StageError};
use crate::link::session::{Inbound, Sender, Transport};
use futures_util::StreamExt;
use std::process::Stdio;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// The attempt's dir and inputs, its cgroup, the init spawned; `plan` gets the command's
/// environment and working directory, which name the dir.
pub(crate) async fn provision(
    site: &Arc<ProcessSite>,
    req: &Request,
    plan: &mut Plan,
    cleanup: &mut Cleanup,
    cancel: &CancellationToken,
) -> Result<(Provisioned<Own>, Option<u64>), LaunchError> {
    let cfg = &site.config;
    cleanup.lease = lease_uid(site).await?;
    let identity = prepare::identity(cfg, cleanup.lease.as_ref().map(|l| l.uid), site.euid);
    let dir = AttemptDir::create(&site.attempts, &plan.decided.name, identity)
        .map_err(|e| LaunchError::staging("the attempt's dir", e))?;
    cleanup.dir = Some(dir.clone());
    plan.decided.env = prepare::env(cfg, req, &dir, &site.init);
    plan.decided.cwd = dir.tmp.display().to_string();
    let (inputs, sealed) = match plan.inputs.take() {
        Some((src, staged)) => {
            let (i, s) = copy_inputs(src, staged, &dir, identity, req.progress.clone()).await?;
            (Some(i), Some(s))
        }
        None => (None, None),
    };
    let staged_at = inputs.as_ref().map(|_| crate::contract::unix_ms_now());
    let limits = plan.limits.limits;
    let cg = cgroup::create(&cfg.cgroup, &plan.decided.name, limits);
    let seen = Seen { config: cfg, euid: site.euid, leased: site.uids.is_some() };
    let (enforcement, mut skipped) = enforcement(seen, &limits, &cg, sealed, identity);
    for (k, why) in &plan.limits.skipped {
        skipped.entry(k.clone()).or_insert_with(|| why.clone());
    }
    cleanup.cgroup = cg.ok().flatten();
    if cancel.is_cancelled() {
        return Err(LaunchError::CancelledBeforeStart);
    }
    let (transport, init_pid, ticks) = spawn_init(site, &dir, identity, cleanup).await?;
    let layout = Layout {
        in_dir: dir.input.display().to_string(),
        out_dir: dir.output.display().to_string(),
        takeover_uid: Some(site.euid),
        takeover_fd: Some(super::spawn::TAKEOVER_FD),
        rlimits: cfg.rlimits.clone(),
        cgroup_dir: None,
        measure: Vec::new(),
        mounts: Vec::new(),
        image_env: None,
        tmp_dir: None,
        sampled_cgroup: cleanup.cgroup.as_ref().map(cgroup::Cgroup::sampled),
        credentials: None,
        // stevedore writes this cgroup itself, and reads it from the host.
        held: Vec::new(),
    };
    let own = Own {
        dir,
        cgroup: cleanup.cgroup.clone(),
        init_pid,
        start_ticks: ticks,
        memory: limits.memory_bytes,
        cpu_millis: limits.cpu_millis,
        uid: identity.map(|(u, _)| u),
    };
    Ok((Provisioned { transport, running: true, own, layout, enforcement, skipped, inputs }, staged_at))
}

/// Spawns the init as the command's uid, in the attempt's cgroup, with only its pipes and
/// its takeover socket open; names it in the attempt's pid file (for `reclaim` after a
/// crash). Its transport, pid and start ticks.
async fn spawn_init(
    site: &ProcessSite,
    dir: &AttemptDir,
    identity: Option<(u32, u32)>,
    cleanup: &mut Cleanup,
) -> Result<(Transport, i32, u64), LaunchError> {
    let mut cmd = tokio::process::Command::new(&site.init);
    cmd.env_clear()
        .current_dir(&dir.tmp)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Out of the worker's process group: a terminal's Ctrl-C is the worker's to handle.
        .process_group(0);
    if let Some((uid, gid)) = identity {
        cmd.uid(uid).gid(gid);
    }
    let listener = dir.takeover_listener().map_err(|e| LaunchError::staging("the attempt's takeover socket", e))?;
    super::spawn::with_takeover_fd(&mut cmd, listener);
    let mut child = super::spawn::spawn_when_not_busy(&mut cmd)
        .await
        .map_err(|e| LaunchError::staging(format!("starting the init {}", site.init.display()), e))?;
    // Closes this process's copy of the takeover socket: the init holds it now.
    drop(cmd);
    let init_pid = child.id().map_or(0, |p| p as i32);
    let (stdin, stdout, stderr) = (child.stdin.take(), child.stdout.take(), child.stderr.take());
    cleanup.init = Some(child);
    let ticks = start_ticks(init_pid).unwrap_or(0);
    let uid = identity.map_or(site.euid, |(u, _)| u);
    std::fs::write(dir.root.join(PID_FILE), format!("{init_pid} {ticks} {uid}\n"))
        .map_err(|e| LaunchError::staging("the attempt's pid file", e))?;
    if let Some(c) = &cleanup.cgroup {
        c.enter(init_pid as u32)
            .map_err(|e| LaunchError::Staging { what: "moving the init into its cgroup".into(), source: e.into() })?;
    }
    let (Some(stdin), Some(stdout), Some(stderr)) = (stdin, stdout, stderr) else {
        return Err(LaunchError::Staging { what: "the init's pipes".into(), source: "missing".into() });
    };
    let inbound = futures_util::stream::select(
        tokio_util::io::ReaderStream::new(stdout).map(|r| r.map(Inbound::Link)),
        tokio_util::io::ReaderStream::new(stderr).map(|r| r.map(Inbound::InitStderr)),
    );
    Ok(((Box::pin(inbound), Sender::new(Box::pin(stdin))), init_pid, ticks))
}

/// Leases the attempt's uid, when the rung leases them (off the runtime's threads: it reads
/// `/proc` and may sweep).
async fn lease_uid(site: &Arc<ProcessSite>) -> Result<Option<super::uids::Lease>, LaunchError> {
    let s = site.clone();
    let leased = tokio::task::spawn_blocking(move || s.uids.as_ref().map(|u| u.lease()).transpose())
        .await
        .map_err(|e| LaunchError::staging("leasing a uid", e))?;
    leased.map_err(|e| match e {
        e @ (super::uids::UidError::Exhausted { .. } | super::uids::UidError::Taken { .. }) => {
            LaunchError::AdmissionRefused(e.to_string())
        }
        e => LaunchError::staging("leasing a uid", e),
    })
}

/// Copies the input dir into `dir.input` (regular files, dirs and symlinks, through
/// descriptors, within the limit) and seals it.
async fn copy_inputs(
    input: InputDir,
    staged: InputsStaged,
    dir: &AttemptDir,
    run_as: Option<(u32, u32)>,
    progress: Option<crate::contract::ProgressSink>,
) -> Result<(InputsStaged, bool), LaunchError> {
    let (bytes, limit) = (staged.bytes, staged.limit_bytes);
    let dest = dir.clone();
    let (report, sealed) = tokio::task::spawn_blocking(move || {
        let (reader, writer) = std::io::pipe().map_err(|e| LaunchError::staging("a pipe", e))?;
        let into = dest.input.clone();
        let unpack = std::thread::spawn(move || {
            let mut a = tar::Archive::new(reader);
            a.set_preserve_permissions(false);
            a.unpack(&into)
        });
        let phase = crate::contract::Phase::Inputs;
        let writer =
            crate::contract::Counting { inner: writer, sink: progress.clone(), phase, total: Some(bytes), done: 0 };
        let written = input.write_tar(crate::inputs::Owners::User(0, 0), limit, writer, &|_| {});
        if let Some(s) = progress.as_ref().filter(|_| written.is_ok()) {
            s.report(crate::contract::Progress { phase, done: bytes, total: Some(bytes), finished: true });
        }
        let unpacked =
            unpack.join().map_err(|_| LaunchError::staging("copying the inputs", std::io::Error::other("panicked")))?;
        let report = written.map_err(|e| match e {
            StageError::TooLarge { limit } => LaunchError::InputTooLarge { bytes: limit + 1, limit },
            e => LaunchError::staging("reading the input dir", e),
        })?;
        unpacked.map_err(|e| LaunchError::staging("copying the inputs", e))?;
        let sealed = dest.seal_inputs(run_as).map_err(|e| LaunchError::staging("sealing the inputs", e))?;
        Ok::<_, LaunchError>((report, sealed))
    })
    .await
    .map_err(|e| LaunchError::staging("copying the inputs", e))??;
    Ok((InputsStaged { skipped: report.skipped, sparse: report.sparse, tree: Some(report.tree), ..staged }, sealed))
}
