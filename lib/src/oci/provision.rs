//! Phase 2 of an oci attempt: the bundle (its dir, carrying the worker's hash and the
//! attempt id, with an owner marker, a private sealed copy of the inputs and `config.json`),
//! then `runtime --root STATE run --bundle B ID` as a child whose stdin and stdout ARE the
//! link to the init (the runtime hands its stdio to the container's process: no socket on a
//! bind mount). Everything is in the attempt's `Cleanup` before the call that makes it.

use super::cleanup::Cleanup;
use super::ledger::Own;
use super::prepare::Plan;
use super::site::OciSite;
use super::spec::{SpecInput, build, enforcement};
use crate::attempt::{Layout, Provisioned};
use crate::contract::{InputsStaged, LaunchError, Request};
use crate::inputs::{InputDir, Owners, StageError};
use crate::link::session::{Inbound, Sender, Transport};
use futures_util::StreamExt;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use stevedore_init::wire::{IN_DIR, OUT_DIR, TMP_DIR, TOOLS_DIR};
use tokio_util::sync::CancellationToken;

/// The file in a bundle naming its owner (`<worker>\n<incarnation>\n<runtime>\n`), checked
/// before removal; `reclaim` leaves a bundle another runtime runs.
pub(crate) const OWNER_FILE: &str = "owner";
/// The attempt's `/out` in the bundle: a tmpfs of the disk limit the host mounts (0700, the
/// sandbox user's; `nosuid,nodev,noexec`), bound into the container, walked in place by the
/// host at the init's end (`outputs::in_place`), unmounted before the bundle goes.
pub(crate) const OUT_MOUNT: &str = "out";
/// The init's takeover socket in the bundle (0700, root's): bound here, handed to the init as
/// fd 3 through the runtime; a restarted worker connects to it (`recover`).
pub(crate) const TAKEOVER_SOCKET: &str = "ctl";

pub(crate) async fn provision(
    site: &OciSite,
    req: &Request,
    plan: &mut Plan,
    cleanup: &mut Cleanup,
    cancel: &CancellationToken,
) -> Result<(Provisioned<Own>, Option<u64>), LaunchError> {
    let name = plan.decided.name.clone();
    let bundle = site.bundles.join(&name);
    cleanup.bundle = Some(bundle.clone());
    cleanup.held = plan.held.take();
    std::fs::DirBuilder::new().mode(0o700).create(&bundle).map_err(|e| LaunchError::staging("the bundle", e))?;
    let owner = format!("{}\n{}\n{}\n", req.worker_id, site.base.incarnation, site.runtime.display());
    write_new(&bundle.join(OWNER_FILE), owner.as_bytes())
        .map_err(|e| LaunchError::staging("the bundle's owner marker", e))?;
    let out = mount_out(&bundle, plan.sizes.disk, site.config.user)?;
    let (input_dir, inputs) = match plan.inputs.take() {
        Some((src, staged)) => {
            let at = bundle.join("in");
            let staged = copy_inputs(src, staged, at.clone(), req.progress.clone()).await?;
            (Some(at), Some(staged))
        }
        None => (None, None),
    };
    let staged_at = inputs.as_ref().map(|_| crate::contract::unix_ms_now());
    let input = SpecInput {
        rootfs: &plan.rootfs,
        tools: &site.tools,
        input: input_dir.as_deref(),
        out: &out,
        sizes: &plan.sizes,
        user: site.config.user,
        name: &name,
        reserve: site.config.link.delivery_reserve,
        seccomp: &site.seccomp,
        apparmor: &site.apparmor,
        held: site.holds_cgroup,
    };
    let spec = build(&input).map_err(|e| LaunchError::staging("the bundle's config.json", e))?;
    let json = serde_json::to_vec(&spec).map_err(|e| LaunchError::staging("the bundle's config.json", e))?;
    write_new(&bundle.join("config.json"), &json).map_err(|e| LaunchError::staging("the bundle's config.json", e))?;
    let (enforcement, skipped) = enforcement(&input);
    if cancel.is_cancelled() {
        return Err(LaunchError::CancelledBeforeStart);
    }
    // Recorded before the run: a runtime that got as far as making its container leaves it
    // to `runtime delete`.
    cleanup.id = Some(name.clone());
    if site.holds_cgroup {
        let memory = plan.sizes.memory.saturating_add(site.config.link.delivery_reserve);
        let held = super::held::Held::make(&name, memory).map_err(|why| {
            LaunchError::staging("the memory cgroup held above the runtime's", std::io::Error::other(why))
        })?;
        cleanup.cgroup = Some(held);
    }
    let (transport, runtime_pid, start_ticks) = spawn(site, &bundle, &name, cleanup)?;
    let mut mounts = vec![TOOLS_DIR.to_owned(), OUT_DIR.to_owned(), TMP_DIR.to_owned()];
    if input_dir.is_some() {
        mounts.push(IN_DIR.to_owned());
    }
    let layout = Layout {
        in_dir: IN_DIR.to_owned(),
        out_dir: OUT_DIR.to_owned(),
        takeover_uid: site.takeover.then(|| nix::unistd::geteuid().as_raw()),
        takeover_fd: site.takeover.then_some(crate::link::inherit::TAKEOVER_FD),
        rlimits: Vec::new(),
        cgroup_dir: Some(stevedore_init::cgroup::CGROUP_ROOT.to_owned()),
        measure: Vec::new(),
        mounts,
        image_env: None,
        tmp_dir: Some(TMP_DIR.to_owned()),
        sampled_cgroup: None,
        credentials: None,
        // stevedore writes this cgroup itself, and reads it from the host.
        held: Vec::new(),
    };
    let own = Own {
        id: name,
        bundle,
        runtime_pid,
        start_ticks,
        image_ref: plan.image_ref.clone(),
        image_id: plan.image.id.clone(),
        memory: plan.sizes.memory,
        cpu_millis: plan.sizes.cpu_millis,
        disk: plan.sizes.disk,
    };
    Ok((Provisioned { transport, running: true, own, layout, enforcement, skipped, inputs }, staged_at))
}

/// `runtime run`, its stdin and stdout the link, its stderr the runtime's and the init's.
fn spawn(site: &OciSite, bundle: &Path, id: &str, cleanup: &mut Cleanup) -> Result<(Transport, i32, u64), LaunchError> {
    let mut cmd = match site.takeover {
        true => {
            let ctl = bundle.join(TAKEOVER_SOCKET);
            let listener = std::os::unix::net::UnixListener::bind(&ctl)
                .map_err(|e| LaunchError::staging("the attempt's takeover socket", e))?;
            let bundle = bundle.display().to_string();
            // fd 3 goes through the runtime to the init, which takes it as its takeover socket.
            let mut cmd = site.runtime_cmd(&["run", "--preserve-fds", "1", "--bundle", &bundle, id]);
            crate::link::inherit::with_takeover_fd(&mut cmd, listener.into());
            cmd
        }
        false => site.runtime_cmd(&["run", "--bundle", &bundle.display().to_string(), id]),
    };
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Out of the worker's process group: a terminal's Ctrl-C is the worker's to handle.
        .process_group(0);
    let mut child = cmd.spawn().map_err(|e| LaunchError::staging(format!("starting {}", site.runtime.display()), e))?;
    let pid = child.id().map_or(0, |p| p as i32);
    let ticks = super::cleanup::start_ticks(pid).unwrap_or(0);
    let (stdin, stdout, stderr) = (child.stdin.take(), child.stdout.take(), child.stderr.take());
    // One waiter owns the runtime's process: the witness and the removal both read its end.
    let (ended, exit) = tokio::sync::watch::channel(None);
    site.base.tracker.spawn(async move {
        use std::os::unix::process::ExitStatusExt;
        let code = child.wait().await.ok().and_then(|s| s.code().or_else(|| s.signal().map(|n| 128 + n)));
        let _ = ended.send(Some(code.unwrap_or(-1)));
    });
    site.exits.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(id.to_owned(), exit.clone());
    cleanup.runtime = Some((pid, super::cleanup::Runtime::Child(exit)));
    let (Some(stdin), Some(stdout), Some(stderr)) = (stdin, stdout, stderr) else {
        return Err(LaunchError::Staging { what: "the runtime's pipes".into(), source: "missing".into() });
    };
    let inbound = futures_util::stream::select(
        tokio_util::io::ReaderStream::new(stdout).map(|r| r.map(Inbound::Link)),
        tokio_util::io::ReaderStream::new(stderr).map(|r| r.map(Inbound::InitStderr)),
    );
    Ok(((Box::pin(inbound), Sender::new(Box::pin(stdin))), pid, ticks))
}

/// Mounts the attempt's `/out` (`OUT_MOUNT`) in the bundle; `remove_bundle` unmounts it.
fn mount_out(bundle: &Path, size: u64, (uid, gid): (u32, u32)) -> Result<PathBuf, LaunchError> {
    use nix::mount::{MsFlags, mount};
    let out = bundle.join(OUT_MOUNT);
    std::fs::DirBuilder::new().mode(0o700).create(&out).map_err(|e| LaunchError::staging("the outputs' dir", e))?;
    // tmpfs reads a size of 0 as no bound at all.
    let data = format!("size={},mode=0700,uid={uid},gid={gid}", size.max(4096));
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount(Some("tmpfs"), &out, Some("tmpfs"), flags, Some(data.as_str()))
        .map_err(|e| LaunchError::staging("the outputs' tmpfs", std::io::Error::from(e)))?;
    Ok(out)
}

fn write_new(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)?;
    f.write_all(bytes)
}

/// Copies the input dir into `into` as root's entries without write bits (through
/// descriptors, within the limit): the private copy bound read-only at `/in`.
async fn copy_inputs(
    input: InputDir,
    staged: InputsStaged,
    into: PathBuf,
    progress: Option<crate::contract::ProgressSink>,
) -> Result<InputsStaged, LaunchError> {
    let (bytes, limit) = (staged.bytes, staged.limit_bytes);
    let report = tokio::task::spawn_blocking(move || {
        std::fs::DirBuilder::new()
            .mode(0o755)
            .create(&into)
            .map_err(|e| LaunchError::staging("the inputs' copy", e))?;
        let (reader, writer) = std::io::pipe().map_err(|e| LaunchError::staging("a pipe", e))?;
        let unpack = std::thread::spawn(move || {
            let mut a = tar::Archive::new(reader);
            a.set_preserve_permissions(true);
            a.set_preserve_ownerships(true);
            a.unpack(&into)
        });
        let phase = crate::contract::Phase::Inputs;
        let writer =
            crate::contract::Counting { inner: writer, sink: progress.clone(), phase, total: Some(bytes), done: 0 };
        let written = input.write_tar(Owners::RootReadOnly, limit, writer, &|_| {});
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
        Ok::<_, LaunchError>(report)
    })
    .await
    .map_err(|e| LaunchError::staging("copying the inputs", e))??;
    Ok(InputsStaged { skipped: report.skipped, sparse: report.sparse, tree: Some(report.tree), ..staged })
}
