//! Nothing grows without bound on the host (issue 14): the tools bundles of rebuilt or
//! removed binaries are pruned, and packing a tag again removes the image it replaced.
//!
//! The bundle tests use a base dir of their own; the engine tests only look at (and remove)
//! the images they made, by id or by a label unique to the test.

use crate::support;

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};
use stevedore::image::bundle::{ExeBundle, prune, sha256_file};
use stevedore::image::{PackSpec, ensure_image, pack_image};
use support::{TEST_LABEL, engine};

const BUSYBOX: &str = "/bin/busybox";

/// Writes a copy of `from` with `tail` appended at `path` (replacing it by a rename, as a
/// build does), executable. `None` when `from` is missing.
fn variant_of(from: &Path, path: &Path, tail: &[u8]) -> Option<()> {
    let mut bytes = fs::read(from).ok()?;
    bytes.extend_from_slice(tail);
    let tmp = path.with_extension(format!("tmp-{:08x}", rand::random::<u32>()));
    fs::write(&tmp, bytes).unwrap();
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755)).unwrap();
    fs::rename(&tmp, path).unwrap();
    Some(())
}

/// [`variant_of`] busybox, and its sha256.
fn busybox_variant(path: &Path, tail: &[u8]) -> String {
    variant_of(Path::new(BUSYBOX), path, tail).expect("busybox");
    sha256_file(path).unwrap()
}

/// A static binary at `path` (a copy of busybox, made distinct by `tail`), or `None` after
/// saying why the test is skipped.
fn busybox_at(path: &Path, tail: &[u8]) -> Option<String> {
    if !Path::new(BUSYBOX).exists() {
        support::skip(format!("{BUSYBOX} missing (install busybox-static)"));
        return None;
    }
    Some(busybox_variant(path, tail))
}

/// The entries of a bundle base besides the remembered digests, sorted.
fn entries(base: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(base)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n != "digests")
        .collect();
    names.sort();
    names
}

fn name_of(bundle: &ExeBundle) -> String {
    bundle.host_dir().file_name().unwrap().to_str().unwrap().to_owned()
}

/// The bytes of the regular files under `dir` (not following symlinks).
fn du(dir: &Path) -> u64 {
    let mut total = 0;
    for e in fs::read_dir(dir).unwrap() {
        let meta = fs::symlink_metadata(e.as_ref().unwrap().path()).unwrap();
        if meta.is_dir() {
            total += du(&e.unwrap().path());
        } else if meta.is_file() {
            total += meta.len();
        }
    }
    total
}

#[test]
fn a_rebuilt_binary_supersedes_its_bundle() {
    let t = tempfile::tempdir().unwrap();
    let base = t.path().join("bundles");
    let exe = t.path().join("worker");
    let Some(one) = busybox_at(&exe, b"build one") else { return };
    let first = ExeBundle::prepare(&exe, &base).unwrap();
    assert_eq!(first.exe_sha256(), one);
    let old = first.host_dir().to_owned();
    drop(first);

    let two = busybox_variant(&exe, b"build two");
    let second = ExeBundle::prepare(&exe, &base).unwrap();
    assert_eq!(second.exe_sha256(), two);
    assert!(!old.exists(), "the bundle of the previous build is pruned");
    assert!(second.host_dir().exists());
    assert_eq!(entries(&base), [name_of(&second)], "nothing else, no temporary dir");
    // Preparing the current build again keeps its bundle.
    let again = ExeBundle::prepare(&exe, &base).unwrap();
    assert_eq!(again, second);
    assert_eq!(entries(&base), [name_of(&second)]);
}

#[test]
fn a_bundle_whose_exe_is_gone_is_pruned() {
    let t = tempfile::tempdir().unwrap();
    let base = t.path().join("bundles");
    let (kept, gone) = (t.path().join("kept"), t.path().join("gone"));
    let Some(_) = busybox_at(&kept, b"kept") else { return };
    busybox_variant(&gone, b"gone");
    let doomed = name_of(&ExeBundle::prepare(&gone, &base).unwrap());
    let stays = name_of(&ExeBundle::prepare(&kept, &base).unwrap());
    assert_eq!(entries(&base).len(), 2, "both executables exist: both bundles stay");
    fs::remove_file(&gone).unwrap();
    let pruned = prune(&base).unwrap();
    assert_eq!(pruned.removed, [(doomed, "superseded")]);
    assert!(pruned.freed_bytes > 1 << 20, "{pruned:?}");
    assert_eq!(entries(&base), [stays]);
}

#[test]
fn a_bundle_in_use_is_kept_until_released() {
    let t = tempfile::tempdir().unwrap();
    let base = t.path().join("bundles");
    let exe = t.path().join("worker");
    let Some(_) = busybox_at(&exe, b"one") else { return };
    let held = ExeBundle::prepare(&exe, &base).unwrap();
    busybox_variant(&exe, b"two");
    let current = ExeBundle::prepare(&exe, &base).unwrap();
    assert!(held.host_dir().exists(), "superseded but held: kept");
    let pruned = prune(&base).unwrap();
    assert!(pruned.removed.is_empty(), "{pruned:?}");
    let mut in_use = pruned.in_use.clone();
    in_use.sort();
    let mut expected = vec![name_of(&held), name_of(&current)];
    expected.sort();
    assert_eq!(in_use, expected);
    // Still readable in full while held.
    assert!(held.to_tar().unwrap().len() > 1 << 20);
    let old = held.host_dir().to_owned();
    drop(held);
    assert_eq!(prune(&base).unwrap().removed, [(old.file_name().unwrap().to_str().unwrap().to_owned(), "superseded")]);
    assert_eq!(entries(&base), [name_of(&current)]);
}

#[test]
fn a_bundle_stays_while_any_of_its_paths_holds_its_binary() {
    let t = tempfile::tempdir().unwrap();
    let base = t.path().join("bundles");
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    let Some(_) = busybox_at(&a, b"same") else { return };
    busybox_variant(&b, b"same");
    let shared = name_of(&ExeBundle::prepare(&a, &base).unwrap());
    assert_eq!(name_of(&ExeBundle::prepare(&b, &base).unwrap()), shared, "one bundle per digest");
    busybox_variant(&a, b"rebuilt");
    assert!(prune(&base).unwrap().removed.is_empty(), "b still holds that binary");
    fs::remove_file(&b).unwrap();
    assert_eq!(prune(&base).unwrap().removed, [(shared, "superseded")]);
}

/// What rebuilds of stevedore (dynamic: the loader and libraries are bundled too) leave
/// under the base, before pruning existed (every bundle) and now. The stripped binary
/// keeps it quick (a debug build's sha256 of the 150 MB unstripped one takes ~13 s);
/// `STEVEDORE_LEFTOVERS_FULL=1` measures the unstripped one.
#[test]
fn a_rebuilt_build_leaves_one_bundle() {
    let t = tempfile::tempdir().unwrap();
    let base = t.path().join("bundles");
    let exe = t.path().join("stevedore");
    let bin = match std::env::var_os("STEVEDORE_LEFTOVERS_FULL") {
        Some(_) => support::BIN.into(),
        None => support::stripped_bin(),
    };
    let mut sizes = Vec::new();
    let started = Instant::now();
    for build in 0..3u8 {
        variant_of(&bin, &exe, &[build]).unwrap();
        let bundle = ExeBundle::prepare(&exe, &base).unwrap();
        assert!(bundle.is_dynamic());
        sizes.push(du(bundle.host_dir()));
    }
    let left = du(&base);
    let mb = |b: u64| b as f64 / 1e6;
    eprintln!(
        "3 builds of {:.1} MB: without pruning {:.1} MB of bundles, with pruning {:.1} MB ({} bundle), {:?}",
        mb(fs::metadata(&bin).unwrap().len()),
        mb(sizes.iter().sum()),
        mb(left),
        entries(&base).len(),
        started.elapsed()
    );
    assert_eq!(entries(&base).len(), 1);
    assert!(left < sizes[2] + (1 << 20), "only the last build's bundle (and small digests): {left}");
}

/// The child side of [`concurrent_prepares_across_processes`]: prepares the bundle of the
/// executable named by the environment again and again, checking each tar is whole.
#[test]
fn child_prepares() {
    let (Some(base), Some(exe)) = (std::env::var_os("LEFTOVERS_CHILD_BASE"), std::env::var_os("LEFTOVERS_CHILD_EXE"))
    else {
        return;
    };
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut rounds = 0;
    while Instant::now() < deadline {
        let bundle = ExeBundle::prepare(Path::new(&exe), Path::new(&base)).unwrap();
        let tar = bundle.to_tar().unwrap();
        let mut archive = tar::Archive::new(tar.as_slice());
        let mut entry = archive.entries().unwrap().next().unwrap().unwrap();
        let hashed = stevedore::hash_reader(&mut entry, 0).unwrap();
        assert_eq!(hashed.hash, format!("sha256:{}", bundle.exe_sha256()), "the tar holds the bundle's binary");
        rounds += 1;
    }
    eprintln!("child: {rounds} prepares");
}

/// A small "executable" (ldd calls it static) at `path`, replaced by a rename.
fn small_exe(path: &Path, tail: &[u8]) {
    let mut bytes = b"#!/bin/sh\n".to_vec();
    bytes.resize(64 << 10, b'#');
    bytes.extend_from_slice(tail);
    let tmp = path.with_extension(format!("tmp-{:08x}", rand::random::<u32>()));
    fs::write(&tmp, bytes).unwrap();
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755)).unwrap();
    fs::rename(&tmp, path).unwrap();
}

#[test]
fn concurrent_prepares_across_processes() {
    let t = tempfile::tempdir().unwrap();
    let base = t.path().join("bundles");
    let exe = t.path().join("worker");
    small_exe(&exe, b"0");
    let children: Vec<_> = (0..8)
        .map(|_| {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "leftovers::child_prepares", "--nocapture", "--test-threads=1"])
                .env("LEFTOVERS_CHILD_BASE", &base)
                .env("LEFTOVERS_CHILD_EXE", &exe)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    // Rebuilds meanwhile: every bundle but the newest is superseded, held or not.
    for build in 1..=50u32 {
        std::thread::sleep(Duration::from_millis(40));
        small_exe(&exe, build.to_string().as_bytes());
    }
    for child in children {
        let out = child.wait_with_output().unwrap();
        let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{said}");
        assert!(said.contains("1 passed"), "the child ran: {said}");
        if let Some(line) = said.lines().find(|l| l.starts_with("child:")) {
            eprintln!("{line}");
        }
    }
    let last = ExeBundle::prepare(&exe, &base).unwrap();
    let left = entries(&base);
    // A temporary dir of a child that lost a race is removed by that child.
    assert_eq!(left, [name_of(&last)], "only the newest build's bundle");
}

// ---- images (the engine) ----

/// The ids of the images carrying `label=value` (only this test's images).
async fn images_labelled(docker: &bollard::Docker, value: &str) -> Vec<String> {
    use bollard::query_parameters::ListImagesOptionsBuilder;
    let filters = HashMap::from([("label", vec![format!("{TEST_LABEL}={value}")])]);
    let images = docker.list_images(Some(ListImagesOptionsBuilder::new().all(true).filters(&filters).build())).await;
    let mut ids: Vec<String> = images.unwrap().into_iter().map(|i| i.id).collect();
    ids.sort();
    ids
}

async fn exists(docker: &bollard::Docker, image: &str) -> bool {
    match docker.inspect_image(image).await {
        Ok(_) => true,
        Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => false,
        Err(e) => panic!("inspect {image}: {e}"),
    }
}

fn spec_for(exe: &Path, tag: &str, marker: &str) -> PackSpec {
    let mut spec = PackSpec::new(exe, tag);
    spec.labels.insert(TEST_LABEL.to_owned(), marker.to_owned());
    spec
}

#[tokio::test]
async fn packing_a_tag_again_removes_the_image_it_replaced() {
    let Some(docker) = engine().await else { return };
    let t = tempfile::tempdir().unwrap();
    let exe = t.path().join("worker");
    let Some(_) = busybox_at(&exe, b"one") else { return };
    let marker = format!("repack-{:08x}", rand::random::<u32>());
    let tag = format!("stevedore-test/repack:{marker}");
    let spec = spec_for(&exe, &tag, &marker);

    let first = pack_image(support::seam().await, &spec).await.unwrap();
    // The same tag, another binary (`stevedore image pack --tag T` after a rebuild).
    busybox_variant(&exe, b"two");
    let second = pack_image(support::seam().await, &spec).await.unwrap();
    let first_gone = !exists(&docker, &first.id).await;
    let after_pack = images_labelled(&docker, &marker).await;
    // And through ensure_image (another fingerprint: the tag does not match any more).
    let mut fingerprinted = spec.clone();
    fingerprinted.fingerprint = Some("fp".to_owned());
    let third = ensure_image(support::seam().await, &fingerprinted).await.unwrap();
    let second_gone = !exists(&docker, &second.id).await;
    let after_ensure = images_labelled(&docker, &marker).await;
    let tagged = docker.inspect_image(&tag).await.unwrap().id;
    support::remove_image(&docker, &tag).await;
    let left = images_labelled(&docker, &marker).await;

    assert_ne!(first.id, second.id);
    assert_ne!(second.id, third.id);
    assert!(!third.reused);
    assert!(first_gone, "the image the first pack made is removed");
    assert_eq!(after_pack, std::slice::from_ref(&second.id), "exactly one image for the tag, nothing dangling of ours");
    assert!(second_gone, "ensure_image removes the image it replaced too");
    assert_eq!(after_ensure, std::slice::from_ref(&third.id));
    assert_eq!(tagged.as_deref(), Some(third.id.as_str()));
    assert!(left.is_empty(), "{left:?}");
}

#[tokio::test]
async fn a_replaced_image_with_another_tag_or_a_container_stays() {
    use bollard::models::ContainerCreateBody;
    use bollard::query_parameters::{RemoveContainerOptionsBuilder, TagImageOptionsBuilder};
    let Some(docker) = engine().await else { return };
    let marker = format!("repack-kept-{:08x}", rand::random::<u32>());
    let tag = format!("stevedore-test/repack-kept:{marker}");
    let other = format!("stevedore-test/repack-other:{marker}");
    let mut spec = spec_for(Path::new(BUSYBOX), &tag, &marker);
    if !Path::new(BUSYBOX).exists() {
        support::skip(format!("{BUSYBOX} missing (install busybox-static)"));
        return;
    }

    // An image with another tag is never removed (by id, that would untag it).
    let first = pack_image(support::seam().await, &spec).await.unwrap();
    let (repo, other_tag) = other.rsplit_once(':').unwrap();
    docker.tag_image(&first.id, Some(TagImageOptionsBuilder::new().repo(repo).tag(other_tag).build())).await.unwrap();
    spec.labels.insert("dev.stevedore.test.round".to_owned(), "2".to_owned());
    let second = pack_image(support::seam().await, &spec).await.unwrap();
    let first_tags = docker.inspect_image(&first.id).await.map(|i| i.repo_tags.unwrap_or_default());

    // An image a container was made from (not even started) stays, untagged.
    let body = ContainerCreateBody {
        image: Some(tag.clone()),
        cmd: Some(vec!["true".into()]),
        labels: Some(HashMap::from([(TEST_LABEL.to_owned(), marker.clone())])),
        ..Default::default()
    };
    let container = docker.create_container(None, body).await.unwrap().id;
    spec.labels.insert("dev.stevedore.test.round".to_owned(), "3".to_owned());
    let third = ensure_image(support::seam().await, &spec).await;
    let second_kept = exists(&docker, &second.id).await;
    let ours = images_labelled(&docker, &marker).await;

    // Clean up what this test made, whatever happened.
    let _ = docker.remove_container(&container, Some(RemoveContainerOptionsBuilder::new().force(true).build())).await;
    for image in [tag.as_str(), other.as_str(), second.id.as_str()] {
        support::remove_image(&docker, image).await;
    }
    let left = images_labelled(&docker, &marker).await;

    let third = third.unwrap();
    assert_eq!(first_tags.unwrap(), std::slice::from_ref(&other), "kept, with its other tag");
    assert!(second_kept, "kept while a container uses it");
    let mut expected = vec![first.id.clone(), second.id.clone(), third.id.clone()];
    expected.sort();
    assert_eq!(ours, expected);
    assert!(left.is_empty(), "{left:?}");
}
