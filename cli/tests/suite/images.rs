//! Packing executables into `FROM scratch` images, and the cached busybox test image.

use crate::support;

use std::time::Instant;
use stevedore::image::pack::{LABEL_ENTRY, LABEL_EXE_SHA256, LABEL_FINGERPRINT, LABEL_MANAGED, LABEL_PACKED};
use stevedore::image::{PackError, PackSpec, build_image_from_dir_tar, ensure_image};
use support::{TEST_LABEL, engine, run_container};

#[tokio::test]
async fn packed_dynamic_stevedore_runs_as_non_root_in_scratch() {
    let Some(docker) = engine().await else { return };
    let tag = "stevedore-test/packed-dynamic:latest";
    support::remove_image(&docker, tag).await;
    let mut spec = PackSpec::new(support::BIN, tag);
    spec.fingerprint = Some("test-fingerprint".to_owned());
    spec.labels.insert(TEST_LABEL.to_owned(), "true".to_owned());
    let tricky = r#"a "quoted" \ $HOME=x"#;
    spec.labels.insert("dev.stevedore.test.tricky".to_owned(), tricky.to_owned());

    let t = Instant::now();
    let packed = ensure_image(support::seam().await, &spec).await.unwrap();
    eprintln!("pack (dynamic, fresh): {:?}", t.elapsed());
    assert!(!packed.reused);
    assert_eq!(packed.entry.len(), 4, "{:?}", packed.entry);
    assert!(packed.entry[0].starts_with("/app/lib/ld-linux"));
    assert_eq!(packed.entry[1..3], ["--library-path", "/app/lib"]);
    assert_eq!(packed.entry[3], "/app/stevedore");

    let t = Instant::now();
    let again = ensure_image(support::seam().await, &spec).await.unwrap();
    eprintln!("ensure (reused): {:?}", t.elapsed());
    assert!(again.reused);
    assert_eq!(again.id, packed.id);

    let image = docker.inspect_image(tag).await.unwrap();
    let config = image.config.unwrap();
    let labels = config.labels.unwrap();
    assert_eq!(labels[LABEL_MANAGED], "true");
    assert_eq!(labels[LABEL_PACKED], "true");
    assert_eq!(labels[LABEL_FINGERPRINT], "test-fingerprint");
    assert_eq!(labels[LABEL_EXE_SHA256].len(), 64);
    assert_eq!(labels["dev.stevedore.test.tricky"], tricky);
    let entry: Vec<String> = serde_json::from_str(&labels[LABEL_ENTRY]).unwrap();
    assert_eq!(entry, packed.entry);
    assert_eq!(config.entrypoint.unwrap(), packed.entry);
    assert_eq!(config.user.as_deref(), Some("65532:65532"));

    let t = Instant::now();
    let ran = run_container(&docker, tag, Some("65532"), &["--version"]).await;
    eprintln!("run (create+start+wait+logs+remove): {:?}", t.elapsed());
    assert_eq!(ran.code, 0, "{}", ran.output);

    // A changed fingerprint must not reuse the image.
    spec.fingerprint = Some("other".to_owned());
    let repacked = ensure_image(support::seam().await, &spec).await.unwrap();
    assert!(!repacked.reused);
    support::remove_image(&docker, tag).await;
    // The image the tag pointed to before was stevedore's and is gone.
    assert!(docker.inspect_image(&packed.id).await.is_err());
}

#[tokio::test]
async fn packed_static_busybox_has_the_non_root_user() {
    let Some(docker) = engine().await else { return };
    let tag = "stevedore-test/packed-static:latest";
    let spec = PackSpec::new("/bin/busybox", tag);
    let t = Instant::now();
    let packed = stevedore::image::pack_image(support::seam().await, &spec).await.unwrap();
    eprintln!("pack (static): {:?}", t.elapsed());
    assert_eq!(packed.entry, ["/app/busybox"]);
    // The image's USER applies; /etc/passwd and /etc/group name it.
    let ran = run_container(&docker, tag, None, &["id"]).await;
    assert_eq!(ran.code, 0, "{}", ran.output);
    assert!(ran.output.contains("uid=65532(stevedore) gid=65532(stevedore)"), "{}", ran.output);

    // As with `docker run IMAGE ARGV`, a plain command runs after the image's ENTRYPOINT.
    let w = support::worker("entrypoint");
    let t = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(support::BIN)
        .args(["run", "--outcome", "-", "--quiet", "--worker", &w, "--image", tag, "--output"])
        .arg(t.path().join("o"))
        .args(["--", "sh", "-c", "echo via-entrypoint > /out/x"])
        .output()
        .unwrap();
    support::remove_image(&docker, tag).await;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["status"], "ok", "{v}");
    assert_eq!(std::fs::read_to_string(t.path().join("o/x")).unwrap(), "via-entrypoint\n");
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
}

#[tokio::test]
async fn busybox_image_runs_a_shell() {
    let Some(docker) = engine().await else { return };
    let image = support::busybox_image(&docker).await;
    let labels = docker.inspect_image(&image).await.unwrap().config.unwrap().labels.unwrap();
    assert_eq!(labels[TEST_LABEL], "true");
    assert!(!labels.contains_key(LABEL_MANAGED));
    let ran = run_container(&docker, &image, Some("65532"), &["sh", "-c", "echo hi"]).await;
    assert_eq!(ran.code, 0, "{}", ran.output);
    assert_eq!(ran.output, "hi\n");
    let ran = run_container(&docker, &image, None, &["sh", "-c", "exit 3"]).await;
    assert_eq!(ran.code, 3);
}

#[tokio::test]
async fn a_failing_build_reports_the_builders_message() {
    let Some(docker) = engine().await else { return };
    let tag = "stevedore-test/never-built:latest";
    let context = support::tar_of(&[("Dockerfile", 0o644, b"FROM scratch\nCOPY no-such-file /x\n".as_slice())]);
    let err = build_image_from_dir_tar(support::seam().await, tag, context).await.unwrap_err();
    match &err {
        PackError::Build { message, .. } => assert!(message.contains("no-such-file"), "{message}"),
        other => panic!("expected a build error, got {other:?}"),
    }
    assert!(docker.inspect_image(tag).await.is_err());
}

#[tokio::test]
async fn concurrent_packs_of_one_tag_leave_one_image() {
    use bollard::query_parameters::ListImagesOptionsBuilder;
    let Some(docker) = engine().await else { return };
    let tag = format!("stevedore-test/packed-race:{:08x}", rand::random::<u32>());
    let marker = format!("race-{:08x}", rand::random::<u32>());
    let mut spec = PackSpec::new("/bin/busybox", tag.as_str());
    spec.labels.insert(TEST_LABEL.to_owned(), marker.clone());
    let packs: Vec<_> = (0..4)
        .map(|_| {
            let spec = spec.clone();
            tokio::spawn(async move { ensure_image(support::seam().await, &spec).await })
        })
        .collect();
    let mut ids = Vec::new();
    let mut fresh = 0;
    for p in packs {
        let packed = p.await.unwrap().unwrap();
        fresh += usize::from(!packed.reused);
        ids.push(packed.id);
    }
    let filters = std::collections::HashMap::from([("label", vec![format!("{TEST_LABEL}={marker}")])]);
    let images = docker.list_images(Some(ListImagesOptionsBuilder::new().all(true).filters(&filters).build())).await;
    support::remove_image(&docker, &tag).await;
    let images = images.unwrap();
    assert_eq!(fresh, 1, "one pack, three reuses");
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
    assert_eq!(images.len(), 1, "no untagged duplicate: {images:?}");
}

#[tokio::test]
async fn stale_packed_images_are_listed_and_removed_on_request() {
    use bollard::models::ContainerCreateBody;
    use bollard::query_parameters::RemoveContainerOptionsBuilder;
    use stevedore::image::{remove_images, stale_images};
    let Some(docker) = engine().await else { return };
    let marker = format!("stale-{:08x}", rand::random::<u32>());
    let tag = |name: &str| format!("stevedore-test/{name}:{marker}");
    let (unused, kept, used) = (tag("unused"), tag("kept"), tag("used"));
    for t in [&unused, &kept, &used] {
        let mut spec = PackSpec::new("/bin/busybox", t.as_str());
        spec.labels.insert(TEST_LABEL.to_owned(), marker.clone());
        // Distinct images: the same content and labels would import as one id.
        spec.labels.insert("dev.stevedore.test.name".to_owned(), t.clone());
        stevedore::image::pack_image(support::seam().await, &spec).await.unwrap();
    }
    let body = ContainerCreateBody {
        image: Some(used.clone()),
        cmd: Some(vec!["true".into()]),
        labels: Some([(TEST_LABEL.to_owned(), "true".to_owned())].into()),
        ..Default::default()
    };
    let container = docker.create_container(None, body).await.unwrap().id;

    let only_ours = [format!("{TEST_LABEL}={marker}")];
    let stale = stale_images(support::seam().await, std::slice::from_ref(&kept), &only_ours).await.unwrap();
    let tags: Vec<_> = stale.iter().flat_map(|s| s.tags.clone()).collect();
    let removal = remove_images(support::seam().await, &stale).await;
    let after = stale_images(support::seam().await, &[], &only_ours).await.unwrap();
    docker.remove_container(&container, Some(RemoveContainerOptionsBuilder::new().force(true).build())).await.unwrap();
    for t in [&unused, &kept, &used] {
        support::remove_image(&docker, t).await;
    }
    assert_eq!(tags, [unused], "in use and kept images are not stale");
    assert_eq!((removal.removed.len(), removal.failed.len()), (1, 0), "{removal:?}");
    let after: Vec<_> = after.iter().flat_map(|s| s.tags.clone()).collect();
    assert_eq!(after, [kept], "the used one is in use; the kept one is stale once not kept");
}

/// `stevedore image pack` says when it grows the bundle cache: the new bundle's dir (in the
/// cache `STEVEDORE_BUNDLE_DIR` names) and what the cache holds; a second pack of the same
/// binary finds the bundle and says nothing of it.
#[tokio::test]
async fn the_command_says_where_it_cached_a_bundle_and_how_much_the_cache_holds() {
    let Some(docker) = engine().await else { return };
    let cache = tempfile::tempdir().unwrap();
    let bundles = cache.path().join("bundles");
    let tag = format!("stevedore-test/said-bundle:{:08x}", rand::random::<u32>());
    let pack = || {
        std::process::Command::new(support::BIN)
            .args(["image", "pack", "--exe", "/bin/busybox", "--tag", &tag])
            .env(stevedore::image::bundle::DIR_ENV, &bundles)
            .output()
            .unwrap()
    };
    let first = pack();
    let said = String::from_utf8_lossy(&first.stderr).into_owned();
    assert!(first.status.success(), "{said}");
    let dir = std::fs::read_dir(&bundles)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("bundle-"))
        .expect("a bundle in the cache the environment names");
    let line = said.lines().find(|l| l.starts_with("stevedore: cached a ")).unwrap_or_else(|| panic!("{said}"));
    let between = |from: &str, to: &str| line.split(from).nth(1).and_then(|r| r.split(to).next()).unwrap_or("");
    let cap = stevedore::image::bundle::cap_bytes() as f64 / f64::from(1 << 20);
    assert!(
        line.ends_with(&format!(
            " bundle of the packed binary as {}: the cache holds {} of its {cap:.1} MiB cap \
             (STEVEDORE_BUNDLE_CACHE_MAX bounds it, STEVEDORE_BUNDLE_DIR moves it)",
            dir.display(),
            between("cached a ", " bundle")
        )),
        "the only bundle is the whole cache: {line}"
    );
    // Busybox and the bundle's bookkeeping, a few hundred bytes.
    let busybox = std::fs::metadata("/bin/busybox").unwrap().len() as f64 / f64::from(1 << 20);
    let said_mib: f64 = between("cached a ", " MiB").parse().unwrap();
    assert!((said_mib - busybox).abs() <= 0.1, "{line}");
    let second = pack();
    support::remove_image(&docker, &tag).await;
    let said = String::from_utf8_lossy(&second.stderr);
    assert!(second.status.success() && !said.contains("cached a "), "{said}");
}
