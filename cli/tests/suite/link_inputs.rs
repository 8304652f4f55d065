//! Inputs over the link (`docs/outcome.md`, "Inputs over the link"): a root init writes them
//! and drops to the sandbox user before the command. Hostile: the command tries every way to
//! change them, its capability sets are read, PID 1 is out of its reach; a process planted in
//! a parked container before its claim has the container discarded; a root profile and an
//! engine that ignores `NoCopy` (Podman) take the engine's path and say why.

use crate::support;

use std::time::Duration;
use stevedore::container::{ContainerConfig, PoolConfig};
use stevedore::{Executor, Status};
use support::{labelled, run, setup, sh, worker};

/// Whether the engine under test is Podman (it ignores a mount's `NoCopy`: the old path).
async fn podman(docker: &bollard::Docker) -> bool {
    docker.version().await.unwrap().components.unwrap_or_default().iter().any(|c| c.name.contains("Podman"))
}

fn inputs() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("a.txt"), b"input").unwrap();
    std::fs::create_dir(d.path().join("d")).unwrap();
    std::fs::write(d.path().join("d/b.txt"), b"deep").unwrap();
    d
}

/// Every way through `/in` and the staging mount, each said when it worked; the capability
/// sets; PID 1's memory, environment and descriptors (each behind a ptrace access check).
const HOSTILE: &str = "cat /in/a.txt; \
    for try in 'touch /in/n' 'echo x > /in/a.txt' 'chmod 666 /in/a.txt' 'mv /in/d /in/e' 'rm /in/d/b.txt' \
               'ln /in/a.txt /in/h' 'ln -s /etc /in/s' 'mkdir /in/m' \
               'touch /.stevedore/stage/n' 'echo x > /.stevedore/stage/a.txt' 'chmod 666 /.stevedore/stage/a.txt' \
               'mv /.stevedore/stage/d /.stevedore/stage/e' 'rm /.stevedore/stage/d/b.txt' \
               'ln /.stevedore/stage/a.txt /.stevedore/stage/h' 'chmod 777 /.stevedore/stage' \
               'dd if=/proc/1/mem of=/dev/null bs=1 count=1 skip=4194304' 'cat /proc/1/environ' 'ls /proc/1/fd'; do \
      sh -c \"$try\" >/dev/null 2>&1 && echo \"got through: $try\"; done; \
    grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs|Uid|Groups):' /proc/self/status | sed 's/[[:space:]]*$//'; \
    stat -c '%u %a' /in/a.txt /in/d; cat /in/a.txt /in/d/b.txt";

/// What [`HOSTILE`] prints when nothing got through; the entries are root's over the link,
/// the sandbox user's through the engine (its mount read-only either way). `groups`: the
/// supplementary groups as the engine gives them (none from Docker or from a root init that
/// drops to the configured list; Podman adds the user's gid).
fn expected_stdout(owner: u32, groups: &str) -> String {
    let (zero, uid) = ("0000000000000000", 65532);
    let (file, dir) = if owner == 0 { ("444", "555") } else { ("644", "755") };
    let groups = if groups.is_empty() { String::new() } else { format!("\t{groups}") };
    format!(
        "inputUid:\t{uid}\t{uid}\t{uid}\t{uid}\nGroups:{groups}\nCapInh:\t{zero}\nCapPrm:\t{zero}\nCapEff:\t{zero}\n\
         CapBnd:\t{zero}\nCapAmb:\t{zero}\nNoNewPrivs:\t1\n{owner} {file}\n{owner} {dir}\ninputdeep"
    )
}

fn assert_over_the_link(o: &stevedore::Outcome) {
    let how = &o.evidence.enforcement["inputs_staging"];
    assert!(how.contains("written over the link by the init as uid 0"), "{how}");
    let seen = o.evidence.init_privileges.as_ref().expect("the init's credentials after the drop");
    let zero = "0000000000000000";
    for set in [&seen.cap_inh, &seen.cap_prm, &seen.cap_eff, &seen.cap_bnd, &seen.cap_amb] {
        assert_eq!(set, zero, "{seen:?}");
    }
    assert_eq!((seen.uid.as_str(), seen.no_new_privs.as_str(), seen.dumpable), ("65532 65532 65532 65532", "1", false));
    assert!(o.evidence.enforcement["non_root"].contains("drops to it"), "{:?}", o.evidence.enforcement);
}

/// Lists, at the checkpoint (the sandbox runs, the command not yet), the volumes that carry
/// the worker's labels: the input volume the container's create made is the attempt's.
struct SeeVolumes {
    docker: bollard::Docker,
    worker: String,
    seen: std::sync::Mutex<Vec<String>>,
}

impl stevedore::contract::Hooks for SeeVolumes {
    fn checkpoint<'a>(&'a self, _: &'a stevedore::contract::Checkpoint) -> stevedore::contract::HookResult<'a> {
        Box::pin(async move {
            let (_, volumes) = labelled(&self.docker, &self.worker).await;
            self.seen.lock().unwrap().extend(volumes);
            Ok(())
        })
    }
}

fn assert_through_the_engine(o: &stevedore::Outcome, why: &str) {
    let how = &o.evidence.enforcement["inputs_staging"];
    assert!(how.contains("archive API") && how.contains(why), "{how}");
    assert_eq!(o.evidence.init_privileges, None, "the init never ran as root");
}

/// Cold and warm: the command can change nothing of its inputs, holds no capability, and
/// cannot reach PID 1; on Podman the inputs go through the engine and the command is as bound.
#[tokio::test]
async fn inputs_over_the_link_are_beyond_the_commands_reach() {
    let Some((docker, image)) = setup().await else { return };
    let podman = podman(&docker).await;
    let w = worker("link-in");
    let mut cfg = ContainerConfig::default();
    // The warm pool is this suite's on the local engine (`pool::`); on Podman the case is the
    // path the inputs take, which a cold attempt shows.
    if !podman {
        cfg.pool = Some(PoolConfig::new(1, &w).image(&image));
    }
    cfg.max_tmp_bytes = 16 << 20;
    let rung = support::rung_with(cfg).await;
    assert!(podman || rung.warm_up(Duration::from_secs(60)).await, "the pool fills");
    let given = inputs();
    let t = tempfile::tempdir().unwrap();
    // Warm first (the parked container), then cold: another image name for the same image.
    let id = docker.inspect_image(&image).await.unwrap().id.unwrap();
    let paths = match podman {
        false => vec![("warm", image.as_str(), Some(true)), ("cold", id.as_str(), Some(false))],
        true => vec![("cold", id.as_str(), None)],
    };
    for (what, img, warm) in paths {
        let seen =
            std::sync::Arc::new(SeeVolumes { docker: docker.clone(), worker: w.clone(), seen: Default::default() });
        let req = sh(img, &w, &t.path().join(what), HOSTILE).input_dir(given.path()).hooks(seen.clone());
        let o = run(&rung, &req).await;
        let volumes = seen.seen.lock().unwrap().clone();
        let prefix = format!("sd-{w}-");
        let input = volumes.iter().any(|v| v.starts_with(&prefix) && v.ends_with("-in"));
        assert!(input, "{what}: the input volume is labelled as the worker's: {volumes:?}");
        assert_eq!((o.status, o.evidence.warm), (Status::Ok, warm), "{what}: {}", o.to_json());
        let (owner, groups) = if podman { (65532, "65532") } else { (0, "") };
        assert_eq!(support::stdout_of(&o), expected_stdout(owner, groups), "{what}: {}", o.to_json());
        if podman {
            assert_through_the_engine(&o, "NoCopy");
        } else {
            assert_over_the_link(&o);
        }
        let staged = o.evidence.inputs.as_ref().unwrap();
        assert_eq!((staged.files, staged.bytes), (2, 9), "{what}");
        let digest = stevedore::replay::input_tree(given.path()).unwrap();
        assert_eq!(staged.tree.as_deref(), Some(digest.as_str()), "{what}: the init wrote what the host read");
    }
    assert_eq!(std::fs::read(given.path().join("a.txt")).unwrap(), b"input", "the caller's inputs untouched");
    rung.close().await;
    assert_eq!(labelled(&docker, &w).await, (vec![], vec![]));
}

/// A process planted in a parked container before its claim (one still running, or a file
/// left in the staging mount): the init refuses the claim, the container is discarded, and
/// the attempt runs cold with its inputs intact.
#[tokio::test]
async fn a_parked_container_touched_before_its_claim_is_discarded() {
    let Some((docker, image)) = setup().await else { return };
    if podman(&docker).await {
        support::skip("Podman ignores NoCopy: its parked containers take no inputs over the link");
        return;
    }
    let w = worker("link-planted");
    let mut cfg = ContainerConfig::default();
    cfg.pool = Some(PoolConfig::new(1, &w).image(&image));
    cfg.max_tmp_bytes = 16 << 20;
    let rung = support::rung_with(cfg).await;
    let given = inputs();
    let t = tempfile::tempdir().unwrap();
    let plants = [
        ("running", "sleep 600 >/dev/null 2>&1 &", "another process"),
        ("file", "touch /.stevedore/stage/planted", "not empty"),
    ];
    for (what, plant, why) in plants {
        assert!(rung.warm_up(Duration::from_secs(60)).await, "the pool fills");
        let (parked, _) = labelled(&docker, &w).await;
        assert_eq!(parked.len(), 1, "{parked:?}");
        assert_eq!(support::exec(&docker, &parked[0], plant).await, 0, "{what}: planted");
        let req = sh(&image, &w, &t.path().join(what), "cat /in/a.txt; ls /in").input_dir(given.path());
        let o = run(&rung, &req).await;
        assert_eq!((o.status, o.evidence.warm), (Status::Ok, Some(false)), "{what}: {}", o.to_json());
        let said = &o.evidence.skipped["warm_pool"];
        assert!(said.contains("refused the claim") && said.contains(why), "{what}: {said}");
        assert_eq!(support::stdout_of(&o), "inputa.txt\nd\n", "{what}: {}", o.to_json());
        assert_over_the_link(&o);
        assert!(o.evidence.container_id.as_deref() != Some(parked[0].as_str()));
    }
    rung.close().await;
    assert_eq!(labelled(&docker, &w).await, (vec![], vec![]), "the discarded containers are gone");
}

/// A profile that runs the sandbox as root keeps the engine's path and says why.
#[tokio::test]
async fn a_root_profile_keeps_the_engines_path() {
    let Some((docker, image)) = setup().await else { return };
    let w = worker("link-root");
    let given = inputs();
    let t = tempfile::tempdir().unwrap();
    let mut cfg = ContainerConfig::default();
    cfg.user = "0:0".into();
    let rung = support::rung_with(cfg).await;
    let req = sh(&image, &w, &t.path().join("o"), "id -u; cat /in/a.txt").input_dir(given.path());
    let o = run(&rung, &req).await;
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    assert_eq!(support::stdout_of(&o), "0\ninput", "{}", o.to_json());
    assert_through_the_engine(&o, "root's");
    rung.close().await;
    assert_eq!(labelled(&docker, &w).await, (vec![], vec![]));
}

/// Inputs above `link_inputs_max_bytes` keep the archive upload, cold and warm.
#[tokio::test]
async fn inputs_above_the_links_limit_go_through_the_engine() {
    let Some((docker, image)) = setup().await else { return };
    if podman(&docker).await {
        support::skip("Podman ignores NoCopy: its parked containers take no inputs over the link");
        return;
    }
    let w = worker("link-big");
    let mut cfg = ContainerConfig::default().link_inputs_max_bytes(4);
    cfg.pool = Some(PoolConfig::new(1, &w).image(&image));
    cfg.max_tmp_bytes = 16 << 20;
    let rung = support::rung_with(cfg).await;
    assert!(rung.warm_up(Duration::from_secs(60)).await, "the pool fills");
    let given = inputs();
    let t = tempfile::tempdir().unwrap();
    let id = docker.inspect_image(&image).await.unwrap().id.unwrap();
    for (what, img, warm) in [("warm", image.as_str(), Some(true)), ("cold", id.as_str(), Some(false))] {
        let script =
            "cat /in/a.txt; stat -c '%u %a' /in/a.txt; touch /.stevedore/stage/x 2>/dev/null && echo wrote; true";
        let req = sh(img, &w, &t.path().join(what), script).input_dir(given.path());
        let o = run(&rung, &req).await;
        assert_eq!((o.status, o.evidence.warm), (Status::Ok, warm), "{what}: {}", o.to_json());
        let how = &o.evidence.enforcement["inputs_staging"];
        assert!(how.contains("archive API") && how.contains("link_inputs_max_bytes"), "{what}: {how}");
        let out = support::stdout_of(&o);
        assert!(out.starts_with("input") && !out.contains("wrote"), "{what}: {out}");
    }
    rung.close().await;
    assert_eq!(labelled(&docker, &w).await, (vec![], vec![]));
}
