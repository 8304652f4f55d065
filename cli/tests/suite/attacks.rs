//! The red team's attacks, each reproduced against the real engine: by the command, by the
//! image, by another local user, by an input set. Each must leave the record true and the
//! host untouched. (The two races on staging, a subdirectory swapped for a symlink and a
//! file growing while it is copied, are made deterministic with a hook in
//! `container::staging`'s unit tests.)

use crate::support;

use support::{BIN, run, rung_with, setup, sh as cmd};

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use stevedore::container::ContainerConfig;
use stevedore::{Executor, LaunchError, Reason, Request, Status};
use tokio_util::sync::CancellationToken;

const NOTHING: (Vec<String>, Vec<String>) = (Vec::new(), Vec::new());

/// A shared object that, when a dynamic loader maps it, writes a marker into /out saying
/// whether it ran in PID 1 (the init) or in another process. No libc: raw syscalls only,
/// so it loads into anything that has a loader.
const EVIL_C: &str = r#"
static long sc(long n, long a, long b, long c) {
    long r;
    __asm__ volatile ("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
    return r;
}
__attribute__((constructor)) static void pwn(void) {
    const char *p = sc(39, 0, 0, 0) == 1 ? "/out/pwned-pid1" : "/out/loaded-in-a-command";
    long fd = sc(2, (long)p, 0101, 0644);
    sc(1, fd, (long)"pwned\n", 6);
}
unsigned int la_version(unsigned int v) { return v; }
"#;

/// Builds `stevedore-test/evil-env:<unique>`: busybox, the shared object above, an
/// `/etc/ld.so.preload` naming it, and every loader variable set in `ENV`.
async fn evil_image(docker: &bollard::Docker) -> String {
    let busybox = support::busybox_image(docker).await;
    let t = tempfile::tempdir().unwrap();
    std::fs::write(t.path().join("evil.c"), EVIL_C).unwrap();
    let so = t.path().join("evil.so");
    let gcc = Command::new("gcc")
        .args(["-shared", "-fPIC", "-nostdlib", "-O2", "-o"])
        .arg(&so)
        .arg(t.path().join("evil.c"))
        .output()
        .expect("gcc is needed to build the attack's shared object");
    assert!(gcc.status.success(), "{}", String::from_utf8_lossy(&gcc.stderr));
    let dockerfile = format!(
        "FROM {busybox}\nCOPY evil.so /evil.so\nCOPY ld.so.preload /etc/ld.so.preload\n\
         ENV LD_PRELOAD=/evil.so LD_AUDIT=/evil.so LD_LIBRARY_PATH=/ GLIBC_TUNABLES=glibc.malloc.check=3\n\
         LABEL {}=true\n",
        support::TEST_LABEL
    );
    let so_bytes = std::fs::read(&so).unwrap();
    let context = support::tar_of(&[
        ("Dockerfile", 0o644, dockerfile.as_bytes()),
        ("evil.so", 0o755, &so_bytes),
        ("ld.so.preload", 0o644, b"/evil.so\n"),
    ]);
    let tag = format!("stevedore-test/evil-env:{:08x}", rand::random::<u32>());
    stevedore::image::build_image_from_dir_tar(support::seam().await, &tag, context)
        .await
        .expect("building the evil image");
    tag
}

#[tokio::test]
async fn an_images_loader_variables_and_ld_so_preload_never_reach_the_init() {
    let Some((docker, _)) = setup().await else { return };
    let image = evil_image(&docker).await;
    let rung = rung_with(ContainerConfig::default()).await;
    let w = support::worker("evil-env");
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("o");
    let o = run(&rung, &cmd(&image, &w, &out, "env | grep -E '^(LD_|GLIBC_)' | sort; exit 3")).await;
    support::remove_image(&docker, &image).await;
    // The record is the init's own: true exit code, real usage.
    assert_eq!((o.status, o.exit_code), (Status::HandlerError, Some(3)), "{}", o.to_json());
    assert_eq!(o.usage.sources.cpu_time_ms.as_ref().unwrap().to_string(), "cgroup");
    assert!(!out.join("pwned-pid1").exists(), "the image's loader settings ran code in the init");
    // The command still sees the image's environment, as the contract says.
    assert_eq!(
        support::stdout_of(&o),
        "GLIBC_TUNABLES=glibc.malloc.check=3\nLD_AUDIT=/evil.so\nLD_LIBRARY_PATH=/\nLD_PRELOAD=/evil.so\n"
    );
    assert_eq!(support::labelled(&docker, &w).await, NOTHING);
    rung.close().await;
}

#[tokio::test]
async fn the_command_cannot_reach_the_inits_key_link_or_stop_it() {
    let Some((docker, image, rung)) = support::setup_with_rung().await else { return };
    let w = support::worker("pid1");
    let t = tempfile::tempdir().unwrap();
    // The init is not dumpable and the command has no capabilities: its memory,
    // environment and descriptors (the link) are closed to the command, although both run
    // as the same user. A SIGTERM from inside is not the host's stop.
    let script = "cat /proc/1/environ >/dev/null 2>&1 && echo environ; \
                  head -c 1 /proc/1/mem >/dev/null 2>&1 && echo mem; \
                  ls /proc/1/fd >/dev/null 2>&1 && echo fds; \
                  echo forged > /proc/1/fd/1 2>/dev/null && echo link; \
                  kill -TERM 1; sleep 1; echo survived";
    let o = run(&rung, &cmd(&image, &w, &t.path().join("o"), script)).await;
    assert_eq!((o.status, o.exit_code), (Status::Ok, Some(0)), "{}", o.to_json());
    assert_eq!(support::stdout_of(&o), "survived\n");
    assert!(o.evidence.init_diagnostics.iter().any(|d| d.contains("ignored signal 15")), "{:?}", o.evidence);
    assert_eq!(support::labelled(&docker, &w).await, NOTHING);
    rung.close().await;
}

#[tokio::test]
async fn a_sparse_terabyte_and_a_fifo_in_out_neither_stall_nor_hide_the_real_output() {
    let Some((docker, image, rung)) = support::setup_with_rung().await else { return };
    let w = support::worker("sparse");
    let t = tempfile::tempdir().unwrap();
    let script = "truncate -s 1099511627776 /out/a-sparse; mkfifo /out/b-fifo; echo 42 > /out/result.txt; exit 3";
    let started = Instant::now();
    let o = run(&rung, &cmd(&image, &w, &t.path().join("o"), script).timeout(Duration::from_secs(30))).await;
    let took = started.elapsed();
    assert!(took < Duration::from_secs(20), "collection took {took:?}");
    // The status stays true; the reason says the outputs hit a cap; what fits is collected.
    assert_eq!(
        (o.status, o.exit_code, o.reason),
        (Status::HandlerError, Some(3), Some(Reason::OutputLimit)),
        "{}",
        o.to_json()
    );
    assert_eq!(o.outputs.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(), ["result.txt"]);
    let refused: Vec<(&str, &str)> =
        o.evidence.refused_outputs.iter().map(|r| (r.name.as_str(), r.why.as_str())).collect();
    assert_eq!(refused, [("a-sparse", "over_cap"), ("b-fifo", "fifo")]);
    assert!(o.usage.disk_written_bytes.unwrap() < 1 << 20, "a sparse file is not bytes written: {}", o.to_json());
    assert_eq!(support::labelled(&docker, &w).await, NOTHING);
    rung.close().await;
}

#[tokio::test]
async fn output_modes_and_counts_are_bounded() {
    let Some((docker, image)) = setup().await else { return };
    let caps = stevedore::OutputCaps { max_files: 50, max_total_bytes: 1 << 20 };
    let rung = rung_with(ContainerConfig::default().output_caps(caps)).await;
    let w = support::worker("modes");
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("o");
    let script = "echo x > /out/a-open; chmod 0777 /out/a-open; chmod 4755 /out/a-open 2>/dev/null; mkdir -m 0777 /out/d; \
                  i=0; while [ $i -lt 300 ]; do : > /out/d/f$i; i=$((i+1)); done";
    let o = run(&rung, &cmd(&image, &w, &out, script)).await;
    assert_eq!((o.status, o.reason), (Status::Ok, Some(Reason::OutputLimit)), "{}", o.to_json());
    assert_eq!(o.outputs.len(), 50, "the first 50 files by name");
    assert_eq!(o.outputs[0].name, "a-open");
    let files = std::fs::read_dir(out.join("d")).map(|d| d.count()).unwrap_or_else(|e| panic!("{e}: {}", o.to_json()));
    assert!(files <= 50, "{files} files reached the host");
    for p in [out.join("a-open"), out.join("d")] {
        let mode = std::fs::metadata(&p).unwrap().mode() & 0o7777;
        assert_eq!(mode & 0o7022, 0, "{}: mode {mode:o} lets another user write or run as the owner", p.display());
    }
    assert_eq!(support::labelled(&docker, &w).await, NOTHING);
    rung.close().await;
}

#[tokio::test]
async fn inputs_over_the_limit_are_refused_before_anything_is_created() {
    let Some((docker, image)) = setup().await else { return };
    let rung = rung_with(ContainerConfig::default().max_input_bytes(64 << 20)).await;
    let w = support::worker("bigin");
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("in");
    std::fs::create_dir(&input).unwrap();
    std::fs::File::create(input.join("sparse")).unwrap().set_len(1 << 30).unwrap();
    let r = cmd(&image, &w, &t.path().join("o"), "true").input_dir(&input);
    let err = rung.run(&r, CancellationToken::new()).await.unwrap_err();
    assert!(
        matches!(err, LaunchError::InputTooLarge { bytes, limit } if bytes == 1 << 30 && limit == 64 << 20),
        "{err}"
    );
    assert!(err.is_permanent());
    rung.close().await;
    assert_eq!(support::labelled(&docker, &w).await, NOTHING);
}

#[tokio::test]
async fn a_capture_dir_another_user_placed_first_is_refused_and_left_alone() {
    let Some((docker, image)) = setup().await else { return };
    let t = tempfile::tempdir().unwrap();
    let base = t.path().join("logs");
    std::fs::create_dir(&base).unwrap();
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o700)).unwrap();
    let victim = t.path().join("victim");
    std::fs::create_dir(&victim).unwrap();
    std::fs::write(victim.join("keep.txt"), b"precious").unwrap();
    let w = support::worker("logdir");
    std::os::unix::fs::symlink(&victim, base.join(&w)).unwrap();
    let rung = rung_with(ContainerConfig::default().log_dir(&base)).await;
    let err = rung.run(&cmd(&image, &w, &t.path().join("o"), "echo hi"), CancellationToken::new()).await.unwrap_err();
    assert!(stevedore::error_chain(&err).contains("refusing"), "{}", stevedore::error_chain(&err));
    let report = rung.reclaim(&w).await.unwrap();
    assert!(report.paths_removed.is_empty());
    assert_eq!(std::fs::read(victim.join("keep.txt")).unwrap(), b"precious");
    assert_eq!(std::fs::read_dir(&victim).unwrap().count(), 1, "nothing written into the victim");
    rung.close().await;
    assert_eq!(support::labelled(&docker, &w).await, NOTHING);

    // Captures of a normal run are private: 0600 files in 0700 dirs.
    let w = support::worker("logmode");
    let rung = rung_with(ContainerConfig::default().log_dir(&base)).await;
    let o = run(&rung, &cmd(&image, &w, &t.path().join("p"), "echo hi")).await;
    rung.close().await;
    let path = o.evidence.logs.stdout.path.clone().unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
    assert_eq!(std::fs::metadata(Path::new(&path).parent().unwrap()).unwrap().mode() & 0o777, 0o700);
}

#[test]
fn ids_that_would_be_paths_are_refused_by_the_command() {
    let t = tempfile::tempdir().unwrap();
    let out = Command::new(BIN).args(["reclaim", "--worker", ".."]).output().unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("invalid worker id"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for bad in ["..", "a/b", ".hidden"] {
        let out = Command::new(BIN)
            .args(["run", "--outcome", "-", "--worker", bad, "--image", "x", "--output"])
            .arg(t.path().join("o"))
            .args(["--", "true"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(125), "{bad}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stderr).contains("invalid worker id"), "{bad}");
    }
}

#[test]
fn a_symlinked_output_and_a_non_utf8_argv_are_refused_clearly() {
    use std::os::unix::ffi::OsStrExt;
    let t = tempfile::tempdir().unwrap();
    std::fs::create_dir(t.path().join("real")).unwrap();
    std::os::unix::fs::symlink(t.path().join("real"), t.path().join("link")).unwrap();
    let out = Command::new(BIN)
        .args(["run", "--outcome", "-", "--image", "x", "--output"])
        .arg(t.path().join("link"))
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is a symlink"), "{}", String::from_utf8_lossy(&out.stderr));
    let out = Command::new(BIN)
        .args(["run", "--outcome", "-", "--image", "x", "--output"])
        .arg(t.path().join("o"))
        .arg("--")
        .arg(std::ffi::OsStr::from_bytes(b"caf\xe9"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not valid UTF-8"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!t.path().join("o").exists());
}

#[tokio::test]
async fn a_handler_image_without_main_hook_is_refused_naming_it() {
    let Some((docker, image)) = setup().await else { return };
    // A "worker image" whose entry is busybox: it never speaks the handler protocol.
    let tag = format!("stevedore-test/not-a-worker:{:08x}", rand::random::<u32>());
    let dockerfile = format!(
        "FROM {image}\nLABEL dev.stevedore.entry=\"[\\\"/bin/sh\\\",\\\"-c\\\",\\\"echo I am no stevedore worker >&2; exit 1\\\"]\" {}=true\n",
        support::TEST_LABEL
    );
    stevedore::image::build_image_from_dir_tar(
        support::seam().await,
        &tag,
        support::tar_of(&[("Dockerfile", 0o644, dockerfile.as_bytes())]),
    )
    .await
    .unwrap();
    let rung = rung_with(ContainerConfig::default()).await;
    let w = support::worker("nohook");
    let t = tempfile::tempdir().unwrap();
    let r = Request::handler("j", "echo", t.path().join("o")).worker(w.as_str()).image(tag.as_str());
    let err = rung.run(&r, CancellationToken::new()).await.unwrap_err();
    support::remove_image(&docker, &tag).await;
    assert!(matches!(err, LaunchError::HandlerProtocol { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("sandbox::main_hook") && text.contains("I am no stevedore worker"), "{text}");
    rung.close().await;
    assert_eq!(support::labelled(&docker, &w).await, NOTHING);
}

/// An image that plants its own `/.stevedore/tools/stevedore-init` (which, run as PID 1, would
/// get the attempt's key and forge the record), on a rung whose tools volume another process's
/// `reclaim --tools` takes between two attempts. Docker makes the volume again when the next
/// container mounts it, but empty, never filled from the image (`NoCopy`), and labelled as
/// the rung's: that attempt cannot start. Podman ignores `NoCopy`: there the rung checks its
/// volume before every mount and makes a new one. Either way the planted init never runs,
/// the next attempt gets a new volume, and `close` leaves nothing.
#[tokio::test]
async fn an_image_cannot_fill_a_taken_tools_volume_with_its_own_init() {
    let Some((docker, busybox)) = setup().await else { return };
    let dockerfile =
        format!("FROM {busybox}\nCOPY init /.stevedore/tools/stevedore-init\nLABEL {}=true\n", support::TEST_LABEL);
    let planted = b"#!/bin/sh\necho the planted init ran >&2\nexit 0\n";
    let context = support::tar_of(&[("Dockerfile", 0o644, dockerfile.as_bytes()), ("init", 0o755, planted)]);
    let image = format!("stevedore-test/planted-init:{:08x}", rand::random::<u32>());
    stevedore::image::build_image_from_dir_tar(support::seam().await, &image, context)
        .await
        .expect("building the image");
    // The init from a tools volume (on a local engine it would come from a host directory).
    let mut cfg = ContainerConfig::default();
    cfg.init_from_host = false;
    let rung = rung_with(cfg).await;
    let w = support::worker("planted-init");
    let t = tempfile::tempdir().unwrap();

    let first = run(&rung, &cmd(&image, &w, &t.path().join("o1"), "echo real")).await;
    assert_eq!(first.status, Status::Ok, "{}", first.to_json());
    let init = first.evidence.init.clone().unwrap();
    let volume = init.strip_prefix("volume ").and_then(|v| v.split(' ').next()).unwrap().to_owned();
    // The take needs the first attempt's container gone. Its removal is awaited unless the
    // engine refused it for a while (the Outcome's notes then say it goes on in the
    // background): wait for the engine to say it is removed, as `reclaim` would find it.
    let id = first.evidence.container_id.clone().expect("a container id");
    let opts = bollard::query_parameters::WaitContainerOptionsBuilder::default().condition("removed").build();
    let mut removed = docker.wait_container(&id, Some(opts));
    let _gone = tokio::time::timeout(Duration::from_secs(150), futures_util::StreamExt::next(&mut removed)).await;
    if let Err(e) = docker.remove_volume(&volume, None::<bollard::query_parameters::RemoveVolumeOptions>).await {
        let holders = docker
            .list_containers(Some(bollard::query_parameters::ListContainersOptionsBuilder::default().all(true).build()))
            .await
            .unwrap_or_default()
            .into_iter()
            .map(|c| (c.id, c.names, c.state, c.labels))
            .collect::<Vec<_>>();
        panic!(
            "taking the tools volume {volume}: {e}; the first attempt's container {id}, notes {:?}; containers now: {holders:?}",
            first.evidence.notes
        );
    }

    let second = rung.run(&cmd(&image, &w, &t.path().join("o2"), "echo real"), CancellationToken::new()).await;
    let podman =
        docker.version().await.unwrap().components.unwrap_or_default().iter().any(|c| c.name.contains("Podman"));
    if podman {
        let o = second.expect("the rung checked its volume and made a new one");
        assert_eq!((o.status, support::stdout_of(&o).as_str()), (Status::Ok, "real\n"), "{}", o.to_json());
    } else {
        let err = second.map(|o| o.to_json()).expect_err("a container whose init is not stevedore's must not start");
        assert!(stevedore::error_chain(&err).contains("no such file"), "{err:?}");
        let remade = docker.inspect_volume(&volume).await.unwrap().labels;
        assert_eq!(remade.get("dev.stevedore.kind").map(String::as_str), Some("tools"), "{remade:?}");
        assert_eq!(remade.get("dev.stevedore.incarnation").map(String::as_str), Some(rung.incarnation()));
    }

    let third = run(&rung, &cmd(&image, &w, &t.path().join("o3"), "echo real")).await;
    assert_eq!((third.status, support::stdout_of(&third).as_str()), (Status::Ok, "real\n"), "{}", third.to_json());
    assert_ne!(third.evidence.init, Some(init), "a new tools volume");
    rung.close().await;
    support::remove_image(&docker, &image).await;
    let left = support::volumes_of_incarnation(&docker, rung.incarnation()).await;
    assert!(left.is_empty(), "left behind: {left:?}");
    assert_eq!(support::labelled(&docker, &w).await, NOTHING);
}

// ---------------------------------------------------------------------------------------
// Second round: mounts laid over stevedore's own, a neighbour on the process rung, stray
// descriptors, the takeover, engine addresses, what stevedore prints, sparse files.
// ---------------------------------------------------------------------------------------

/// A tar of a build context: files, and symlinks as symlinks (`COPY root/ /` keeps them).
fn context(files: &[(&str, &[u8])], links: &[(&str, &str)]) -> Vec<u8> {
    let mut tar = tar::Builder::new(Vec::new());
    for (path, data) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o755);
        tar.append_data(&mut h, path, *data).unwrap();
    }
    for (path, target) in links {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        h.set_mode(0o777);
        tar.append_link(&mut h, path, target).unwrap();
    }
    tar.into_inner().unwrap()
}

/// An image of busybox whose root has `links` (path in the image → target) and, at
/// `/.stevedore/tools/stevedore-init`, an init of its own that leaves a mark if it ever runs.
async fn redirecting_image(docker: &bollard::Docker, links: &[(&str, &str)]) -> String {
    let busybox = support::busybox_image(docker).await;
    // Unique per image: a layer two builds shared could be pruned under the other's feet.
    let planted = format!(
        "#!/bin/sh\n# {:08x}\ntouch /out/PLANTED-INIT-RAN /tmp/PLANTED-INIT-RAN 2>/dev/null\nexit 0\n",
        rand::random::<u32>()
    );
    let planted = planted.as_bytes();
    let rooted: Vec<(String, &str)> = links.iter().map(|(p, t)| (format!("root{p}"), *t)).collect();
    let rooted: Vec<(&str, &str)> = rooted.iter().map(|(p, t)| (p.as_str(), *t)).collect();
    let dockerfile = format!(
        "FROM {busybox}\nCOPY init /.stevedore/tools/stevedore-init\nCOPY root/ /\nLABEL {}=true\n",
        support::TEST_LABEL
    );
    let ctx = context(&[("Dockerfile", dockerfile.as_bytes()), ("init", planted), ("root/.keep", b"")], &rooted);
    let tag = format!("stevedore-test/redirect:{:08x}", rand::random::<u32>());
    stevedore::image::build_image_from_dir_tar(support::seam().await, &tag, ctx)
        .await
        .expect("building the redirecting image");
    tag
}

/// Runs `script` in an image whose `link` is a symlink to `target`, with `cache` mounted
/// there (or, without one, the image alone moving stevedore's own mount); the attempt must
/// be refused before anything of it runs, naming the path and where it points.
async fn refused_for(link: &str, target: &str, cache: Option<&str>, with_inputs: bool) {
    let Some((docker, _)) = setup().await else { return };
    let image = redirecting_image(&docker, &[(link, target)]).await;
    let mut cfg = ContainerConfig::default();
    if let Some(c) = cache {
        cfg.caches.push(stevedore::container::CacheMount::parse(&format!("redirect:{c}")).unwrap());
    }
    let rung = rung_with(cfg).await;
    let w = support::worker("redirect");
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("in");
    std::fs::create_dir(&input).unwrap();
    std::fs::write(input.join("f"), b"input").unwrap();
    let mut req = cmd(&image, &w, &t.path().join("o"), "echo the command ran > /out/ran")
        .scope(Some(format!("redirect-{:08x}", rand::random::<u32>())), None);
    if with_inputs {
        req = req.input_dir(&input);
    }
    let o = run(&rung, &req).await;
    rung.close().await;
    support::remove_image(&docker, &image).await;
    assert_eq!(
        (o.status, o.reason, o.permanent),
        (Status::LaunchFailed, Some(Reason::MountRedirected), true),
        "{}",
        o.to_json()
    );
    assert!(o.handler_error.contains(link) && o.handler_error.contains(target), "{}", o.handler_error);
    assert!(o.outputs.is_empty() && !t.path().join("o/ran").exists(), "nothing of the attempt ran");
    assert!(!t.path().join("o/PLANTED-INIT-RAN").exists(), "the image's own init ran");
    assert_eq!(support::labelled(&docker, &w).await, NOTHING, "the probe and everything else are gone");
    let left = support::volumes_of_incarnation(&docker, rung.incarnation()).await;
    assert!(left.is_empty(), "{left:?}");
    if cache.is_some() {
        // The cache volume was made (its scope is this test's own): it goes with the test.
        let _ = Command::new(BIN).args(["cache", "rm", "redirect", "--app"]).arg(req.app_id.unwrap()).output();
    }
}

/// A fresh named cache starts empty, whatever the image holds at its path: the engine would
/// otherwise fill the new volume from the image (no `NoCopy`), and the image's files would be
/// every later attempt's cache.
#[tokio::test]
async fn a_fresh_cache_is_never_filled_from_the_image() {
    let Some((docker, _)) = setup().await else { return };
    let busybox = support::busybox_image(&docker).await;
    let dockerfile =
        format!("FROM {busybox}\nCOPY root/ /\nLABEL {}=true\n# {:08x}\n", support::TEST_LABEL, rand::random::<u32>());
    let ctx = context(
        &[("Dockerfile", dockerfile.as_bytes()), ("root/var/cache/app/FROM-THE-IMAGE", b"planted by the image")],
        &[],
    );
    let image = format!("stevedore-test/cache-fill:{:08x}", rand::random::<u32>());
    stevedore::image::build_image_from_dir_tar(support::seam().await, &image, ctx).await.expect("building the image");
    let mut cfg = ContainerConfig::default();
    cfg.caches.push(stevedore::container::CacheMount::parse("fill:/var/cache/app").unwrap());
    let rung = rung_with(cfg).await;
    let w = support::worker("cache-fill");
    let t = tempfile::tempdir().unwrap();
    let app = format!("fill-{:08x}", rand::random::<u32>());
    let req = cmd(&image, &w, &t.path().join("o"), "ls -A /var/cache/app > /out/ls").scope(Some(app.clone()), None);
    let o = run(&rung, &req).await;
    rung.close().await;
    support::remove_image(&docker, &image).await;
    let _ = Command::new(BIN).args(["cache", "rm", "fill", "--app", &app]).output();
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    let listed = std::fs::read_to_string(t.path().join("o/ls")).unwrap();
    assert_eq!(listed, "", "the new cache volume holds the image's files");
    assert_eq!(support::labelled(&docker, &w).await, NOTHING);
}

#[tokio::test]
async fn a_cache_laid_over_the_tools_is_refused_and_the_planted_init_never_runs() {
    refused_for("/var/cache/app/pip", "/.stevedore/tools", Some("/var/cache/app/pip"), false).await;
}

#[tokio::test]
async fn a_cache_laid_over_out_is_refused() {
    refused_for("/var/cache/out", "/out", Some("/var/cache/out"), false).await;
}

#[tokio::test]
async fn a_cache_laid_over_in_is_refused() {
    refused_for("/var/cache/in", "/in", Some("/var/cache/in"), true).await;
}

#[tokio::test]
async fn a_cache_laid_over_tmp_is_refused() {
    refused_for("/var/cache/tmp", "/tmp", Some("/var/cache/tmp"), false).await;
}

#[tokio::test]
async fn an_image_whose_out_is_a_symlink_is_refused() {
    refused_for("/out", "/var/elsewhere", None, false).await;
}

#[tokio::test]
async fn an_image_whose_in_is_a_symlink_is_refused() {
    refused_for("/in", "/var/elsewhere", None, true).await;
}

#[tokio::test]
async fn an_image_whose_tmp_is_a_symlink_is_refused() {
    refused_for("/tmp", "/var/elsewhere", None, false).await;
}

#[tokio::test]
async fn an_image_whose_stevedore_dir_is_a_symlink_is_refused() {
    refused_for("/.stevedore", "/var/elsewhere", None, false).await;
}

/// The same refusal through the command: the exit status of a launch that failed (126),
/// the path and its target on the one line.
#[tokio::test]
async fn the_command_says_which_path_was_redirected() {
    let Some((docker, _)) = setup().await else { return };
    let image = redirecting_image(&docker, &[("/out", "/srv")]).await;
    let t = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["run", "--image", &image, "--output"])
        .arg(t.path().join("o"))
        .args(["--", "true"])
        .output()
        .unwrap();
    support::remove_image(&docker, &image).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(126), "{stderr}");
    assert!(
        stderr.contains("launch_failed (mount_redirected)") && stderr.contains("/out a symlink to /srv"),
        "{stderr}"
    );
}

/// Whatever the worker inherited, the command starts with exactly 0, 1, 2 and the report
/// socket: in a container, as on the process rung (`tests/init.rs` pins the init itself).
#[tokio::test]
async fn a_containers_command_starts_with_exactly_its_stdio_and_the_report_socket() {
    let Some((docker, image, rung)) = support::setup_with_rung().await else { return };
    let w = support::worker("fds");
    let t = tempfile::tempdir().unwrap();
    let o =
        run(&rung, &Request::command("j", ["ls", "/proc/self/fd"], t.path().join("o")).worker(&w).image(&image)).await;
    rung.close().await;
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    let mut fds: Vec<u32> = support::stdout_of(&o).split_whitespace().filter_map(|w| w.parse().ok()).collect();
    fds.sort_unstable();
    // `ls` holds one more: the directory it lists.
    assert_eq!(&fds[..fds.len() - 1], [0, 1, 2, 3], "{fds:?}");
    assert_eq!(support::labelled(&docker, &w).await, NOTHING);
}

/// An engine address dressed as loopback is refused before anything is dialled, and a
/// password in one is never printed.
#[test]
fn engine_addresses_are_parsed_once_and_never_print_a_password() {
    for tricky in
        ["tcp://192.0.2.7:2375?@127.0.0.1", "tcp://192.0.2.7:2375#@127.0.0.1", "tcp://192.0.2.7:2375\\@127.0.0.1"]
    {
        let out = Command::new(BIN).args(["census", "--host", tricky]).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{tricky}: {stderr}");
        assert!(stderr.contains("not allowed in an engine address"), "{tricky}: {stderr}");
    }
    for secret in
        ["tcp://admin:hunter2@127.0.0.1:1", "https://admin:hunter2@127.0.0.1:1", "ssh://root:hunter2@127.0.0.1"]
    {
        for args in [
            vec!["census", "--host", secret],
            vec!["run", "--host", secret, "--image", "x", "--output", "/nonexistent/o", "--", "true"],
        ] {
            let out = Command::new(BIN).args(&args).env("DOCKER_HOST", secret).output().unwrap();
            let all = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            assert!(!all.contains("hunter2"), "{args:?}: {all}");
            assert_ne!(out.status.code(), Some(0), "{args:?}");
        }
    }
}

/// Text from an image or a handler never reaches the terminal as control characters: an
/// ENTRYPOINT named with ESC and BEL (which would retitle the window and forge a line), a
/// handler's error that starts a new line of stevedore's own.
#[tokio::test]
async fn what_stevedore_prints_escapes_what_the_sandbox_wrote() {
    let Some((docker, busybox)) = setup().await else { return };
    let dockerfile = format!(
        "FROM {busybox}\nENTRYPOINT [\"/bin/\\u001b]0;pwned\\u0007\\u001b[2Jstevedore: ok\"]\nLABEL {}=true\n",
        support::TEST_LABEL
    );
    let tag = format!("stevedore-test/esc:{:08x}", rand::random::<u32>());
    stevedore::image::build_image_from_dir_tar(
        support::seam().await,
        &tag,
        support::tar_of(&[("Dockerfile", 0o644, dockerfile.as_bytes())]),
    )
    .await
    .unwrap();
    let t = tempfile::tempdir().unwrap();
    let out = Command::new(BIN).args(["run", "--image", &tag, "--output"]).arg(t.path().join("o")).output().unwrap();
    support::remove_image(&docker, &tag).await;
    let stderr = out.stderr.clone();
    assert_eq!(out.status.code(), Some(127), "{}", String::from_utf8_lossy(&stderr));
    assert!(
        !stderr.iter().any(|b| *b == 0x1b || *b == 0x07),
        "raw control bytes: {:?}",
        String::from_utf8_lossy(&stderr)
    );
    assert!(String::from_utf8_lossy(&stderr).contains("\\u{1b}]0;pwned\\u{7}"), "{}", String::from_utf8_lossy(&stderr));

    let out = Command::new(BIN)
        .args(["run", "--handler", "fail", "--payload", "boom\u{1b}[2J\nstevedore: ok in 1 ms", "--output"])
        .arg(t.path().join("h"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    // The line of a bundle cached for stevedore's own image aside: the run that packs it
    // first (whichever test that is) says so.
    let ours: Vec<&str> =
        stderr.lines().filter(|l| l.starts_with("stevedore: ") && !l.starts_with("stevedore: cached a ")).collect();
    assert_eq!(ours.len(), 1, "one line of stevedore's own, not a forged second: {stderr}");
    assert!(!stderr.contains('\u{1b}'), "{stderr:?}");

    // Reports from the command: one whose text turns the terminal's writing direction (the
    // init admits it; stevedore's line shows it escaped), one with ESC (the init refuses it).
    let script = r#"for t in "$(printf 'abc\342\200\256def')" "$(printf 'x\033[2Jy')"; do "$STEVEDORE_INIT" report note "$t"; done"#;
    let out = Command::new(BIN)
        .args(["run", "--image", &busybox, "--output"])
        .arg(t.path().join("r"))
        .args(["--", "sh", "-c", script])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let report: Vec<&str> = stderr.lines().filter(|l| l.starts_with("stevedore: report")).collect();
    assert_eq!(report, ["stevedore: report note abc\\u{202e}def"], "{stderr}");
    assert!(!stderr.contains('\u{1b}') && !stderr.contains('\u{202e}'), "{stderr:?}");
}

/// A sparse file larger than `/out` can hold is refused from its size, whatever the caps;
/// the real outputs come back, quickly, and nothing waits on the gigabytes it claims.
#[tokio::test]
async fn a_sparse_file_larger_than_out_is_refused_from_its_size_and_the_rest_is_kept() {
    let Some((docker, image, rung)) = support::setup_with_rung().await else { return };
    let w = support::worker("sparse8g");
    let t = tempfile::tempdir().unwrap();
    let script = "truncate -s 8589934592 /out/a-sparse; echo 42 > /out/result.txt";
    let req =
        cmd(&image, &w, &t.path().join("o"), script).timeout(Duration::from_secs(10)).grace(Duration::from_secs(1));
    let o = run(&rung, &req).await;
    rung.close().await;
    assert_eq!((o.status, o.reason), (Status::Ok, Some(Reason::OutputLimit)), "{}", o.to_json());
    assert_eq!(o.outputs.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(), ["result.txt"]);
    let refused: Vec<(&str, &str)> =
        o.evidence.refused_outputs.iter().map(|r| (r.name.as_str(), r.why.as_str())).collect();
    assert_eq!(refused, [("a-sparse", "over_cap")]);
    let c = o.evidence.collection.clone().expect("the collection is stated");
    assert!(!c.cut && c.deadline_ms >= 30_000, "{c:?}");
    assert_eq!(support::labelled(&docker, &w).await, NOTHING);
}

/// A sparse input counts by its size and is named with what it costs where the sandbox
/// runs: the engine's archive upload writes its holes as zeros (seen from inside).
#[tokio::test]
async fn a_sparse_input_is_named_with_what_it_costs_the_engine() {
    let Some((docker, image, rung)) = support::setup_with_rung().await else { return };
    let w = support::worker("sparsein");
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("in");
    std::fs::create_dir(&input).unwrap();
    std::fs::File::create(input.join("holes")).unwrap().set_len(16 << 20).unwrap();
    let req = cmd(&image, &w, &t.path().join("o"), "du -k /in/holes | cut -f1").input_dir(&input);
    let o = run(&rung, &req).await;
    rung.close().await;
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    let kib: u64 = support::stdout_of(&o).trim().parse().unwrap();
    assert!(kib >= 16 << 10, "the engine holds {kib} KiB of a 16 MiB file with no data");
    let staged = o.evidence.inputs.clone().unwrap();
    assert_eq!(staged.bytes, 16 << 20, "counted by its size");
    assert_eq!(staged.sparse.len(), 1, "{staged:?}");
    assert_eq!((staged.sparse[0].name.as_str(), staged.sparse[0].apparent_bytes), ("holes", 16 << 20));
    assert!(staged.sparse[0].allocated_bytes < 1 << 20);
    assert_eq!(support::labelled(&docker, &w).await, NOTHING);
}

// ---------------------------------------------------------------------------------------
// Third round (issue 41): a forged Outcome replayed, another user's runtime dir, the key
// file, the page's bounds, separators in names, a VOLUME inside stevedore's mounts.
// ---------------------------------------------------------------------------------------

/// `cmd` as another local user (`nobody`), through `setpriv`.
fn as_nobody(args: &[&str]) -> std::process::Output {
    Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups", "--"])
        .args(args)
        .output()
        .expect("setpriv")
}

/// A directory of `nobody`'s own (0755) in `parent`: where another local user puts things.
fn nobodys_dir(parent: &Path, name: &str) -> std::path::PathBuf {
    let d = parent.join(name);
    std::fs::create_dir(&d).unwrap();
    std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o755)).unwrap();
    nix::unistd::chown(&d, Some(nix::unistd::Uid::from_raw(65534)), Some(nix::unistd::Gid::from_raw(65534))).unwrap();
    d
}

/// `stevedore run` of `script` in busybox with `input` (and `extra` options), its Outcome
/// JSON; the run must succeed.
fn run_with_outcome(t: &Path, w: &str, input: &Path, extra: &[&str], script: &str) -> serde_json::Value {
    let outcome = t.join(format!("outcome-{:08x}.json", rand::random::<u32>()));
    let o = Command::new(BIN)
        .args(["run", "-q", "--worker", w, "--image", support::BUSYBOX_IMAGE, "--outcome"])
        .arg(&outcome)
        .arg("--input")
        .arg(input)
        .arg("--output")
        .arg(t.join(format!("out-{:08x}", rand::random::<u32>())))
        .args(extra)
        .args(["--", "sh", "-c", script])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&std::fs::read(&outcome).unwrap()).unwrap()
}

/// The Outcome `genuine` with its action changed by `edit` and its digest made again (the
/// digest is unkeyed: anyone can), written to a new file.
fn forged(t: &Path, genuine: &serde_json::Value, edit: impl Fn(&mut stevedore::contract::Action)) -> String {
    let mut v = genuine.clone();
    let mut action: stevedore::contract::Action = serde_json::from_value(v["evidence"]["action"].clone()).unwrap();
    edit(&mut action);
    action.digest = action.compute_digest();
    v["evidence"]["action"] = serde_json::to_value(&action).unwrap();
    let p = t.join(format!("forged-{:08x}.json", rand::random::<u32>()));
    std::fs::write(&p, v.to_string()).unwrap();
    p.display().to_string()
}

fn replay_of(w: &str, outcome: &str, out: &Path, extra: &[&str]) -> std::process::Output {
    Command::new(BIN).args(["replay", "--worker", w, "--output"]).arg(out).args(extra).arg(outcome).output().unwrap()
}

/// Every file under `dir`, read (the runs' outputs).
fn all_bytes_under(dir: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(all_bytes_under(&p));
            } else if let Ok(b) = std::fs::read(&p) {
                out.extend(b);
            }
        }
    }
    out
}

/// Issue 41, 1: an Outcome whose action was edited and digested again ran what was never
/// recorded without `--trust`: on the process rung (the host, its files and its network)
/// while the plan said "network none"; with a network; with limits raised; and the input dir
/// it named was read (a sparse terabyte hashed for hours, `/etc` read whole) before any check.
/// Now it runs as a plain attempt of the container rung, the plan says so, and what asks
/// for more, or names inputs that are not the attempt's size, is refused unread.
#[tokio::test]
async fn a_forged_outcome_replays_no_more_than_a_plain_attempt() {
    let Some((docker, _)) = setup().await else { return };
    let t = tempfile::tempdir().unwrap();
    let w = support::worker("forged-replay");
    let input = t.path().join("in");
    std::fs::create_dir(&input).unwrap();
    std::fs::write(input.join("x"), b"hello\n").unwrap();
    let genuine = run_with_outcome(t.path(), &w, &input, &[], "cat /in/x > /out/y");
    // A file of the host's, readable by any uid (as the process rung's would be), and a
    // listener on the host's loopback.
    let host = t.path().join("host");
    std::fs::create_dir(&host).unwrap();
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&host, std::fs::Permissions::from_mode(0o755)).unwrap();
    let secret = format!("host-secret-{:016x}", rand::random::<u64>());
    std::fs::write(host.join("secret"), &secret).unwrap();
    std::fs::set_permissions(host.join("secret"), std::fs::Permissions::from_mode(0o644)).unwrap();
    // The listener closes whatever reaches it (so a command on the host never waits on it),
    // and says so; the test's own last connection ends it.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reached = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let listening = {
        let (done, reached) = (done.clone(), reached.clone());
        std::thread::spawn(move || {
            for _ in listener.incoming() {
                if done.load(std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                reached.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        })
    };
    let script = format!(
        "cat {s} > /out/y; busybox nc 127.0.0.1 {port} < {s}; echo ran > /out/ran",
        s = host.join("secret").display()
    );

    // (a) The rung set to process, a new argv.
    let file = forged(t.path(), &genuine, |a| {
        a.rung = "process".into();
        a.network = "host".into();
        a.task = stevedore::contract::ActionTask::Command(vec!["sh".into(), "-c".into(), script.clone()]);
    });
    let out_a = t.path().join("ra");
    let o = replay_of(&w, &file, &out_a, &[]);
    let (stdout, stderr) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(stdout.contains("rung container"), "the rung asked for here, not the file's: {stdout}{stderr}");
    assert!(stdout.contains("not trusted") && stdout.contains("network none"), "{stdout}");
    assert!(std::fs::read(out_a.join("run-1/ran")).is_ok(), "it ran, in the container: {stdout}{stderr}");
    assert!(
        !String::from_utf8_lossy(&all_bytes_under(&out_a)).contains(&secret),
        "the host's file reached the outputs: {stdout}"
    );
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    drop(std::net::TcpStream::connect(("127.0.0.1", port)).unwrap());
    listening.join().unwrap();
    assert!(!reached.load(std::sync::atomic::Ordering::SeqCst), "the command reached the host's loopback");

    // (b) A network, and inputs from another dir: refused; nothing is read or run.
    let refused = |file: &str, says: &[&str]| {
        let out = t.path().join(format!("r{:08x}", rand::random::<u32>()));
        let o = replay_of(&w, file, &out, &[]);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(125), "{stderr}{}", String::from_utf8_lossy(&o.stdout));
        for word in says {
            assert!(stderr.contains(word), "{word:?} not in {stderr}");
        }
        assert!(!out.join("run-1").exists(), "nothing ran");
    };
    refused(&forged(t.path(), &genuine, |a| a.network = "bridge".into()), &["network bridge", "--trust"]);
    refused(&forged(t.path(), &genuine, |a| a.input_dir = Some(host.display().to_string())), &["not the attempt's"]);
    // (c) Limits raised, no deadline.
    refused(
        &forged(t.path(), &genuine, |a| {
            a.limits.insert("memory".into(), 16 << 30);
            a.limits.insert("pids".into(), 1_000_000);
            a.timeout_ms = None;
        }),
        &["memory 17179869184", "pids 1000000", "--trust"],
    );
    // A sparse terabyte where the one file was: refused from its size, never hashed (a read
    // of it would hold this test until its time limit).
    let huge = t.path().join("huge");
    std::fs::create_dir(&huge).unwrap();
    std::fs::File::create(huge.join("x")).unwrap().set_len(1 << 40).unwrap();
    refused(&forged(t.path(), &genuine, |a| a.input_dir = Some(huge.display().to_string())), &["not read"]);
    // `/etc`, as root: refused at the second file.
    refused(&forged(t.path(), &genuine, |a| a.input_dir = Some("/etc".into())), &["not the attempt's"]);
    assert_eq!(support::labelled(&docker, &w).await, NOTHING);
}

/// Issue 41, 1: an Outcome sealed by the user's action key (its MAC) is trusted as whoever
/// holds the key: it replays with what it asks (a network) without `--trust`; the same file
/// edited and digested again is not, and gets no more than a plain attempt.
#[tokio::test]
async fn an_outcome_the_users_key_sealed_is_trusted_and_an_edited_one_is_not() {
    let Some((docker, _)) = setup().await else { return };
    let t = tempfile::tempdir().unwrap();
    let w = support::worker("sealed-replay");
    let input = t.path().join("in");
    std::fs::create_dir(&input).unwrap();
    std::fs::write(input.join("x"), b"hello\n").unwrap();
    let key = t.path().join("key");
    std::fs::write(&key, format!("{:032x}\n", rand::random::<u128>())).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let k = key.display().to_string();
    let genuine =
        run_with_outcome(t.path(), &w, &input, &["--action-key-file", &k, "--network", "bridge"], "cat /in/x > /out/y");
    assert!(genuine["evidence"]["action"]["mac"].as_str().unwrap().starts_with("hmac-sha256:"), "{genuine}");
    let sealed = t.path().join("sealed.json");
    std::fs::write(&sealed, genuine.to_string()).unwrap();
    let o = replay_of(&w, &sealed.display().to_string(), &t.path().join("r1"), &["--action-key-file", &k]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{stdout}{}", String::from_utf8_lossy(&o.stderr));
    assert!(stdout.contains("trusted: sealed by action key") && stdout.contains("network bridge"), "{stdout}");
    assert!(stdout.contains("the same action"), "{stdout}");
    // Edited after the seal: the MAC no longer holds, and a network is more than a plain attempt.
    let edited = forged(t.path(), &genuine, |a| {
        a.task =
            stevedore::contract::ActionTask::Command(vec!["sh".into(), "-c".into(), "echo edited > /out/y".into()]);
    });
    let o = replay_of(&w, &edited, &t.path().join("r2"), &["--action-key-file", &k]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(125), "{stderr}");
    assert!(stderr.contains("network bridge") && stderr.contains("--trust"), "{stderr}");
    assert!(!t.path().join("r2/run-1").exists());
    assert_eq!(support::labelled(&docker, &w).await, NOTHING);
}

/// Issue 41, 3: another local user planted, at a key path in a dir of theirs, a symlink to a
/// root-owned 0400 pseudo-file whose content everyone knows (`/proc/self/personality`): it was
/// taken for root's key. A FIFO there hung the command before any check. Now each is refused
/// at once, by name, and so is root's own key in a directory that user can write.
#[test]
fn a_key_file_another_user_placed_is_never_the_key() {
    if !nix::unistd::geteuid().is_root() {
        support::skip("needs root to place files as another user");
        return;
    }
    support::time_limit();
    let t = tempfile::tempdir().unwrap();
    let theirs = nobodys_dir(t.path(), "theirs");
    let run_with_key = |key: &Path| {
        Command::new(BIN)
            .args(["run", "--image", support::BUSYBOX_IMAGE, "--output"])
            .arg(t.path().join(format!("o{:08x}", rand::random::<u32>())))
            .arg("--action-key-file")
            .arg(key)
            .args(["--", "true"])
            .output()
            .unwrap()
    };
    let refused = |key: &Path, says: &str| {
        let o = run_with_key(key);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(125), "{stderr}");
        assert!(stderr.contains(says), "{says:?} not in {stderr}");
    };
    let link = theirs.join("key");
    assert!(as_nobody(&["ln", "-s", "/proc/self/personality", &link.display().to_string()]).status.success());
    refused(&link, "symlink");
    let fifo = theirs.join("fifo");
    assert!(as_nobody(&["mkfifo", "-m", "600", &fifo.display().to_string()]).status.success());
    refused(&fifo, "not a regular file");
    let planted = theirs.join("planted");
    let o = as_nobody(&["sh", "-c", &format!("umask 077; echo 0123456789abcdef0123 > {}", planted.display())]);
    assert!(o.status.success(), "{o:?}");
    refused(&planted, "belongs to uid 65534");
    // Root's own key, in their directory: they could have put it there.
    let mine = theirs.join("mine");
    std::fs::write(&mine, "0123456789abcdef0123").unwrap();
    std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o600)).unwrap();
    refused(&mine, "can be written by others");
    refused(Path::new("/proc/self/personality"), "proc");
}

/// Issue 41, 2: root's `XDG_RUNTIME_DIR` kept by `su` is another user's, who could swap the
/// init's host copy between the check and the engine's bind and have their binary run as PID
/// 1 of root's attempt (with its key). Under that chain the init comes from a tools volume,
/// the captures from a new private dir, each named in the Outcome; the state dir `reclaim`
/// needs is an error naming the directory and its owner.
#[tokio::test]
async fn another_users_runtime_dir_is_never_bound_or_written() {
    let Some((docker, busybox)) = setup().await else { return };
    if !nix::unistd::geteuid().is_root() {
        support::skip("needs root to make another user's runtime dir");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let xdg = nobodys_dir(t.path(), "run-user-65534");
    std::fs::set_permissions(&xdg, std::fs::Permissions::from_mode(0o700)).unwrap();
    let w = support::worker("xdg-theirs");
    let outcome = t.path().join("o.json");
    let o = Command::new(BIN)
        .args(["run", "-q", "--worker", &w, "--image", &busybox, "--outcome"])
        .arg(&outcome)
        .arg("--output")
        .arg(t.path().join("out"))
        .args(["--", "sh", "-c", "echo hi"])
        .env("XDG_RUNTIME_DIR", &xdg)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&outcome).unwrap()).unwrap();
    let init = v["evidence"]["init"].as_str().unwrap();
    assert!(init.starts_with("volume "), "the init was bound from their dir: {init}");
    assert!(init.contains(&*xdg.display().to_string()) && init.contains("owned by uid 65534"), "{init}");
    let notes = v["evidence"]["notes"].to_string();
    assert!(notes.contains("the captures are in") && notes.contains("owned by uid 65534"), "{notes}");
    assert!(std::fs::read_dir(&xdg).unwrap().next().is_none(), "nothing made in their dir");
    // Where the captures went instead: private, and this test's to remove.
    let fresh = notes.split("the captures are in ").nth(1).unwrap().split(',').next().unwrap().to_owned();
    assert_eq!(std::fs::metadata(&fresh).unwrap().mode() & 0o7777, 0o700, "{fresh}");
    let _ = std::fs::remove_dir_all(&fresh);
    let o = Command::new(BIN).args(["reclaim", "--worker", &w]).env("XDG_RUNTIME_DIR", &xdg).output().unwrap();
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(said.contains(&*xdg.display().to_string()) && said.contains("owned by uid 65534"), "{said}");
    assert_eq!(support::labelled(&docker, &w).await, NOTHING);
}

/// Issue 41, 4: an image declaring `VOLUME /.stevedore/tools/sub` ended in a raw engine 500,
/// no Outcome, and a launch error a job engine requeues forever. It is refused by name,
/// permanent, before anything is made.
#[tokio::test]
async fn a_volume_inside_stevedores_mounts_is_refused_by_name_before_anything_is_made() {
    let Some((docker, busybox)) = setup().await else { return };
    let dockerfile = format!("FROM {busybox}\nVOLUME /.stevedore/tools/sub\nLABEL {}=true\n", support::TEST_LABEL);
    let tag = format!("stevedore-test/nested-volume:{:08x}", rand::random::<u32>());
    stevedore::image::build_image_from_dir_tar(
        support::seam().await,
        &tag,
        support::tar_of(&[("Dockerfile", 0o644, dockerfile.as_bytes())]),
    )
    .await
    .unwrap();
    let w = support::worker("nested-volume");
    let t = tempfile::tempdir().unwrap();
    let rung = support::rung().await;
    let err = rung.run(&cmd(&tag, &w, &t.path().join("o"), "true"), CancellationToken::new()).await.unwrap_err();
    rung.close().await;
    assert!(matches!(&err, LaunchError::ImageVolume { volume, .. } if volume == "/.stevedore/tools/sub"), "{err:?}");
    assert!(err.is_permanent(), "no retry changes the image");
    let o = Command::new(BIN)
        .args(["run", "--worker", &w, "--output"])
        .arg(t.path().join("p"))
        .args([&tag, "true"])
        .output()
        .unwrap();
    support::remove_image(&docker, &tag).await;
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(125), "{stderr}");
    assert!(stderr.contains("VOLUME /.stevedore/tools/sub"), "{stderr}");
    assert_eq!(support::labelled(&docker, &w).await, NOTHING, "nothing was made");
}

/// Issue 41, 4: U+2028, U+2029, U+200B and U+FEFF in a real output's name reached the page
/// raw (and the command's lines). They are shown escaped in both.
#[tokio::test]
async fn separators_and_invisible_characters_in_a_name_are_shown_escaped() {
    let Some((docker, _)) = setup().await else { return };
    let t = tempfile::tempdir().unwrap();
    let w = support::worker("separators");
    let input = t.path().join("in");
    std::fs::create_dir(&input).unwrap();
    let name = r"a$(printf '\342\200\250')b$(printf '\342\200\251')c$(printf '\342\200\213')d$(printf '\357\273\277')";
    let v = run_with_outcome(t.path(), &w, &input, &[], &format!("echo x > \"/out/{name}\""));
    let outcome = t.path().join("o.json");
    std::fs::write(&outcome, v.to_string()).unwrap();
    assert!(v.to_string().contains('\u{2028}'), "the name as written: {v}");
    let page = t.path().join("p.html");
    let o = Command::new(BIN).arg("report").arg(&outcome).arg("--html").arg(&page).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let html = std::fs::read_to_string(&page).unwrap();
    for raw in ['\u{2028}', '\u{2029}', '\u{200b}', '\u{feff}'] {
        assert!(!html.contains(raw), "{raw:?} raw in the page");
    }
    assert!(html.contains("a\\u{2028}b\\u{2029}c\\u{200b}d\\u{feff}"), "shown escaped");
    // The command's own lines: replay prints each output's name.
    let o = replay_of(&w, &outcome.display().to_string(), &t.path().join("r"), &[]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{stdout}{}", String::from_utf8_lossy(&o.stderr));
    assert!(stdout.contains("a\\u{2028}b\\u{2029}c\\u{200b}d\\u{feff}"), "{stdout}");
    for raw in ['\u{2028}', '\u{2029}', '\u{200b}', '\u{feff}'] {
        assert!(!stdout.contains(raw) && !String::from_utf8_lossy(&o.stderr).contains(raw), "{raw:?} raw");
    }
    assert_eq!(support::labelled(&docker, &w).await, NOTHING);
}

/// Issue 41, 4: the page of a crafted 65 MB Outcome was 320 MB, took 1.87 GiB and 20 s.
/// Every list is cut with "… N more", the timeline thinned to the charts' width, and the
/// command's peak memory stays within 4 × the file (measured by `/usr/bin/time`).
#[test]
fn a_crafted_65_mb_outcome_makes_a_small_page_in_little_memory() {
    support::time_limit();
    if !Path::new("/usr/bin/time").exists() {
        assert!(!support::in_ci(), "/usr/bin/time is missing (.ci/run installs `time`)");
        support::skip("/usr/bin/time missing (apt-get install time)");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    // The timeline: six columns of a million samples; a hundred thousand outputs and refused
    // entries; fifty thousand notes; an unknown field of nested lists. Written into a real
    // Outcome's JSON in place of placeholders (a `Value` of it would take gigabytes here).
    let mut o = stevedore::Outcome::new(Status::Ok);
    o.usage.timeline = Some(stevedore::contract::Timeline::default());
    let mut v = serde_json::to_value(&o).unwrap();
    const COLUMNS: [&str; 6] = ["t_ms", "memory_bytes", "cpu_ms", "pids", "out_bytes", "tmp_bytes"];
    for col in COLUMNS {
        v["usage"]["timeline"][col] = format!("@{col}@").into();
    }
    v["outputs"] = "@outputs@".into();
    v["evidence"]["refused_outputs"] = "@refused@".into();
    v["evidence"]["notes"] = "@notes@".into();
    v["crafted"] = "@crafted@".into();
    let list = |n: u64, item: &dyn Fn(u64) -> String| {
        let mut s = String::from("[");
        for i in 0..n {
            if i > 0 {
                s.push(',');
            }
            s.push_str(&item(i));
        }
        s.push(']');
        s
    };
    let mut j = v.to_string();
    for col in COLUMNS {
        j = j.replace(&format!("\"@{col}@\""), &list(1_000_000, &|n| (n * 7).to_string()));
    }
    let outputs = list(100_000, &|n| format!(r#"{{"name":"f{n}","size":1,"hash":"sha256:00","content_type":"x"}}"#));
    j = j.replace("\"@outputs@\"", &outputs);
    j = j.replace("\"@refused@\"", &list(100_000, &|n| format!(r#"{{"name":"r{n}","why":"over_cap"}}"#)));
    j = j.replace("\"@notes@\"", &list(50_000, &|n| format!("\"note {n}\"")));
    let mut crafted = String::from("[");
    while j.len() + crafted.len() < 65_000_000 {
        crafted.push_str("[[0,0,0,0,0,0,0,0],[0,0,0,0,0,0,0,0]],");
    }
    crafted.push_str("[]]");
    j = j.replace("\"@crafted@\"", &crafted);
    drop(crafted);
    let file = t.path().join("crafted.json");
    std::fs::write(&file, &j).unwrap();
    let size = j.len() as u64;
    drop(j);
    let page = t.path().join("p.html");
    let o = Command::new("/usr/bin/time")
        .args(["-f", "maxrss_kib=%M"])
        .arg(BIN)
        .arg("report")
        .arg(&file)
        .arg("--html")
        .arg(&page)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    let kib: u64 = stderr.split("maxrss_kib=").nth(1).unwrap().trim().parse().unwrap();
    let html = std::fs::read_to_string(&page).unwrap();
    println!("a {size}-byte Outcome: a {}-byte page, peak RSS {} MiB", html.len(), kib >> 10);
    assert!(kib * 1024 <= 4 * size, "peak RSS {kib} KiB for a {size}-byte file");
    assert!(html.len() < 8 << 20, "a {}-byte page", html.len());
    assert!(html.contains("100000 files") && html.contains(&format!("… {} more", 100_000 - 200)), "outputs cut");
    assert!(html.contains("1000000 samples, 856 of them drawn"), "the timeline thinned");
    assert!(html.contains(&format!("… {} more", 50_000 - 200)), "notes cut");
}
