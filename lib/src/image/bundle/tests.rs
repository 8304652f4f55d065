//! The bundle cache on a real filesystem: preparing, sharing, recording, pruning.

use super::*;

#[test]
fn digest_is_remembered_by_file_identity() {
    let t = tempfile::tempdir().unwrap();
    let base = t.path().join("base");
    let exe = t.path().join("prog");
    fs::write(&exe, b"version one").unwrap();
    let first = exe_digest(&exe, &base).unwrap();
    assert_eq!(first, sha256_file(&exe).unwrap());
    assert_eq!(fs::read_dir(base.join(DIGESTS)).unwrap().count(), 1, "remembered");
    assert_eq!(exe_digest(&exe, &base).unwrap(), first);
    // A replaced file has another identity, so its digest is computed afresh.
    let new = t.path().join("prog.new");
    fs::write(&new, b"version two!").unwrap();
    fs::rename(&new, &exe).unwrap();
    let second = exe_digest(&exe, &base).unwrap();
    assert_eq!(second, sha256_file(&exe).unwrap());
    assert_ne!(first, second);
}

fn tar_entries(bytes: &[u8]) -> Vec<(String, u32, u64, u64)> {
    let mut archive = tar::Archive::new(bytes);
    archive
        .entries()
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let h = e.header();
            (e.path().unwrap().to_string_lossy().into_owned(), h.mode().unwrap(), h.uid().unwrap(), h.gid().unwrap())
        })
        .collect()
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().mode() & 0o7777
}

#[test]
fn dynamic_bundle_holds_loader_and_libs() {
    let base = tempfile::tempdir().unwrap();
    let base = base.path().join("tools");
    let exe = std::env::current_exe().unwrap();
    let bundle = ExeBundle::prepare(&exe, &base).unwrap();
    assert!(bundle.is_dynamic());
    let loader = bundle.loader().unwrap();
    assert!(loader.starts_with("ld-linux"), "{loader}");
    assert!(bundle.libs().iter().any(|l| l.starts_with("libc.so")));
    let dir = bundle.host_dir();
    assert!(dir.file_name().unwrap().to_str().unwrap().starts_with("bundle-"));
    assert_eq!(mode(&base), 0o700, "a private dir of this user");
    assert_eq!(mode(dir), 0o755);
    assert_eq!(mode(&dir.join("lib")), 0o755);
    assert_eq!(mode(&dir.join(bundle.exe_name())), 0o755);
    assert_eq!(mode(&dir.join("lib").join(loader)), 0o755);
    for lib in bundle.libs() {
        let p = dir.join("lib").join(lib);
        assert!(!fs::symlink_metadata(&p).unwrap().is_symlink(), "{lib}");
        assert_eq!(mode(&p), 0o644, "{lib}");
    }
    // Exactly what ldd listed, nothing else.
    let mut on_disk: Vec<String> =
        fs::read_dir(dir.join("lib")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    on_disk.sort();
    let mut expected: Vec<String> = bundle.libs().to_vec();
    expected.push(loader.to_owned());
    expected.sort();
    assert_eq!(on_disk, expected);

    let name = bundle.exe_name();
    assert_eq!(
        bundle.argv("/.stevedore/tools/"),
        vec![
            format!("/.stevedore/tools/lib/{loader}"),
            "--library-path".to_owned(),
            "/.stevedore/tools/lib".to_owned(),
            format!("/.stevedore/tools/{name}"),
        ]
    );

    let entries = tar_entries(&bundle.to_tar().unwrap());
    assert!(entries.iter().all(|(_, _, uid, gid)| *uid == 0 && *gid == 0));
    assert!(entries.contains(&(name.to_owned(), 0o755, 0, 0)));
    assert!(entries.contains(&(format!("lib/{loader}"), 0o755, 0, 0)));
    assert!(entries.contains(&("lib/".to_owned(), 0o755, 0, 0)));
    assert_eq!(entries.len(), 2 + 1 + bundle.libs().len());
}

#[test]
fn static_bundle_holds_only_the_exe_and_is_reused() {
    let busybox = Path::new("/bin/busybox");
    if !busybox.exists() {
        crate::util::test_skip("/bin/busybox missing (install busybox-static)");
        return;
    }
    let base = tempfile::tempdir().unwrap();
    let first = ExeBundle::prepare(busybox, base.path()).unwrap();
    assert!(!first.is_dynamic());
    let names: Vec<_> = fs::read_dir(first.host_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.starts_with('.'))
        .collect();
    assert_eq!(names, vec!["busybox".to_owned()], "and only hidden bookkeeping besides");
    assert_eq!(first.argv("/t"), vec!["/t/busybox".to_owned()]);
    let entries = tar_entries(&first.to_tar().unwrap());
    assert_eq!(entries, vec![("busybox".to_owned(), 0o755, 0, 0)]);

    let marker = first.host_dir().join("busybox");
    let before = fs::metadata(&marker).unwrap().ino();
    let second = ExeBundle::prepare(busybox, base.path()).unwrap();
    assert_eq!(first, second);
    assert_eq!(fs::metadata(&marker).unwrap().ino(), before, "rebuilt, not reused");
    // No temp dirs left behind.
    let left: Vec<_> =
        fs::read_dir(base.path()).unwrap().map(|e| e.unwrap().file_name()).filter(|n| n != DIGESTS).collect();
    assert_eq!(left.len(), 1, "only the bundle, no temporary dir: {left:?}");
}

#[test]
fn damaged_bundle_is_rebuilt() {
    let base = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let first = ExeBundle::prepare(&exe, base.path()).unwrap();
    let lib = first.host_dir().join("lib").join(&first.libs()[0]);
    fs::write(&lib, b"truncated").unwrap();
    // `first` still holds the damaged one: it is moved aside all the same.
    let second = ExeBundle::prepare(&exe, base.path()).unwrap();
    assert_eq!(first, second);
    assert_ne!(fs::metadata(&lib).unwrap().len(), 9);
    let aside = |base: &Path| {
        fs::read_dir(base)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with(".trash-"))
            .count()
    };
    assert_eq!(aside(base.path()), 1, "kept aside while held");
    drop(first);
    // Its holder gone, the next prune takes what was moved aside (once 10 minutes old).
    let trash = fs::read_dir(base.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(".trash-"))
        .unwrap();
    set_mtime(&trash, SystemTime::now() - DEBRIS_AGE - Duration::from_secs(1));
    let pruned = prune(base.path()).unwrap();
    assert_eq!(pruned.removed.len(), 1, "{pruned:?}");
    assert_eq!(aside(base.path()), 0);
    assert!(second.to_tar().is_ok());
}

fn set_mtime(path: &Path, when: SystemTime) {
    let since = when.duration_since(SystemTime::UNIX_EPOCH).unwrap();
    let t = TimeSpec::new(since.as_secs() as _, since.subsec_nanos() as _);
    utimensat(nix::fcntl::AT_FDCWD, path, &t, &t, UtimensatFlags::NoFollowSymlink).unwrap();
}

fn bundles_in(base: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(base)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n != DIGESTS)
        .collect();
    names.sort();
    names
}

/// A copy of /bin/busybox (static: no ldd libraries to copy) with `tail` appended.
fn busybox_variant(path: &Path, tail: &[u8]) -> Option<String> {
    let mut bytes = fs::read("/bin/busybox").ok()?;
    bytes.extend_from_slice(tail);
    let tmp = path.with_extension("new");
    fs::write(&tmp, bytes).unwrap();
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755)).unwrap();
    fs::rename(&tmp, path).unwrap();
    Some(sha256_file(path).unwrap())
}

#[test]
fn the_pruning_rule() {
    use ExeState::*;
    let fresh = Duration::from_secs(60);
    let old = UNUSED_FOR + Duration::from_secs(1);
    assert_eq!(verdict(true, fresh, &[Same]), None);
    assert_eq!(verdict(true, fresh, &[Other]), Some("superseded"));
    assert_eq!(verdict(true, fresh, &[Gone]), Some("superseded"));
    assert_eq!(verdict(true, fresh, &[Gone, Other]), Some("superseded"));
    assert_eq!(verdict(true, fresh, &[Gone, Same]), None, "one path still holds it");
    assert_eq!(verdict(true, fresh, &[Other, Unknown]), None, "what cannot be checked keeps it");
    assert_eq!(verdict(true, fresh, &[]), None, "no record: only its age counts");
    let day = UNRECORDED_UNUSED_FOR + Duration::from_secs(1);
    assert_eq!(verdict(true, day, &[]), Some("unused"), "no record: a day");
    assert_eq!(verdict(true, day, &[Same]), None, "in use: a week");
    assert_eq!(verdict(true, day, &[Unknown]), None);
    assert_eq!(verdict(true, old, &[]), Some("unused"));
    assert_eq!(verdict(true, old, &[Same]), Some("unused"));
    assert_eq!(verdict(false, fresh, &[Same]), Some("damaged"));
}

#[test]
fn entries_of_the_base_are_told_apart() {
    assert_eq!(classify("bundle-0123456789abcdef"), Entry::Bundle);
    for other in ["bundle-0123456789ABCDEF", "bundle-0123", "digests", "bundle-", "notes", ".hidden", "locks"] {
        assert_eq!(classify(other), Entry::Other, "{other}");
    }
    for debris in [".tmp-bundle-0123456789abcdef-12-0a0b0c0d", ".trash-bundle-x-1", "bundle-0123456789abcdef.damaged-1"]
    {
        assert_eq!(classify(debris), Entry::Debris, "{debris}");
    }
}

#[test]
fn a_bundle_unused_for_a_week_is_pruned_and_a_recent_one_kept() {
    let t = tempfile::tempdir().unwrap();
    let base = t.path().join("base");
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    let (Some(_), Some(_)) = (busybox_variant(&a, b"a"), busybox_variant(&b, b"b")) else {
        crate::util::test_skip("/bin/busybox missing (install busybox-static)");
        return;
    };
    let first = ExeBundle::prepare(&a, &base).unwrap();
    let dir = first.host_dir().to_owned();
    drop(first);
    // Its exe is still there, unchanged: only its age can make it go.
    set_mtime(&dir.join(MARKER), SystemTime::now() - UNUSED_FOR + Duration::from_secs(3600));
    let kept = ExeBundle::prepare(&b, &base).unwrap();
    assert!(dir.exists(), "six days and 23 hours idle: kept");
    set_mtime(&dir.join(MARKER), SystemTime::now() - UNUSED_FOR - Duration::from_secs(1));
    // A bundle with an unreadable manifest goes at once.
    let damaged = base.join("bundle-00000000000000aa");
    fs::create_dir(&damaged).unwrap();
    fs::write(damaged.join(MANIFEST), b"{}").unwrap();
    let mut pruned = prune(&base).unwrap();
    assert!(!dir.exists(), "{pruned:?}");
    pruned.removed.sort();
    assert_eq!(
        pruned.removed,
        [
            ("bundle-00000000000000aa".to_owned(), "damaged"),
            (dir.file_name().unwrap().to_str().unwrap().to_owned(), "unused"),
        ]
    );
    assert_eq!(bundles_in(&base), [kept.host_dir().file_name().unwrap().to_str().unwrap()]);
}

#[test]
fn over_the_size_cap_the_least_recently_used_unheld_bundles_go_first() {
    let t = tempfile::tempdir().unwrap();
    let base = t.path().join("base");
    let exes: Vec<PathBuf> = ["a", "b", "c"].iter().map(|n| t.path().join(n)).collect();
    if exes.iter().enumerate().any(|(i, e)| busybox_variant(e, &[b'0' + i as u8; 4]).is_none()) {
        crate::util::test_skip("/bin/busybox missing (install busybox-static)");
        return;
    }
    let mut dirs = Vec::new();
    let mut held = None;
    for (i, exe) in exes.iter().enumerate() {
        let b = ExeBundle::prepare(exe, &base).unwrap();
        dirs.push(b.host_dir().to_owned());
        // a used three hours ago, b two, c (held) one.
        set_mtime(&b.host_dir().join(MARKER), SystemTime::now() - Duration::from_secs(3600 * (3 - i as u64)));
        if i == 2 {
            held = Some(b);
        }
    }
    let name = |d: &PathBuf| d.file_name().unwrap().to_str().unwrap().to_owned();
    let one = fs::metadata(&exes[0]).unwrap().len();
    // Room for two and a half: the oldest goes, and the cap is met.
    let pruned = prune_to(&base, one * 5 / 2).unwrap();
    assert_eq!(pruned.removed, [(name(&dirs[0]), "over the size cap")], "{pruned:?}");
    assert!(pruned.freed_bytes >= one, "the exe and its bookkeeping: {pruned:?}");
    assert_eq!(bundles_in(&base), [name(&dirs[1]), name(&dirs[2])]);
    // Room for none: what nobody holds goes; the held one stays, however big.
    let pruned = prune_to(&base, 0).unwrap();
    assert_eq!(pruned.removed, [(name(&dirs[1]), "over the size cap")]);
    assert_eq!(pruned.in_use, [name(&dirs[2])]);
    assert_eq!(bundles_in(&base), [name(&dirs[2])]);
    drop(held);
    assert_eq!(prune_to(&base, 0).unwrap().removed, [(name(&dirs[2]), "over the size cap")]);
    assert_eq!(bundles_in(&base), Vec::<String>::new());
}

#[test]
fn a_bundle_of_an_older_stevedore_goes_after_a_day() {
    let t = tempfile::tempdir().unwrap();
    let base = t.path().join("base");
    let exe = t.path().join("prog");
    let Some(_) = busybox_variant(&exe, b"old") else {
        crate::util::test_skip("/bin/busybox missing (install busybox-static)");
        return;
    };
    // What an older stevedore left: no record, no marker.
    let dir = ExeBundle::prepare(&exe, &base).unwrap().host_dir().to_owned();
    fs::remove_dir_all(dir.join(EXES)).unwrap();
    fs::remove_file(dir.join(MARKER)).unwrap();
    set_mtime(&dir, SystemTime::now() - UNRECORDED_UNUSED_FOR + Duration::from_secs(60));
    assert!(prune(&base).unwrap().removed.is_empty(), "less than a day old");
    set_mtime(&dir, SystemTime::now() - UNRECORDED_UNUSED_FOR - Duration::from_secs(1));
    let pruned = prune(&base).unwrap();
    assert_eq!(pruned.removed, [(dir.file_name().unwrap().to_str().unwrap().to_owned(), "unused")]);
    // Reused meanwhile, it would have been adopted instead: recorded and marked.
    let adopted = ExeBundle::prepare(&exe, &base).unwrap();
    fs::remove_dir_all(adopted.host_dir().join(EXES)).unwrap();
    fs::remove_file(adopted.host_dir().join(MARKER)).unwrap();
    drop(adopted);
    let again = ExeBundle::prepare(&exe, &base).unwrap();
    assert!(again.host_dir().join(MARKER).exists());
    assert_eq!(fs::read_dir(again.host_dir().join(EXES)).unwrap().count(), 1);
}

#[test]
fn remembered_digests_unused_for_a_week_are_pruned() {
    let t = tempfile::tempdir().unwrap();
    let base = t.path().join("base");
    let exe = t.path().join("prog");
    fs::write(&exe, b"one").unwrap();
    exe_digest(&exe, &base).unwrap();
    let first = base.join(DIGESTS).join(identity(&fs::metadata(&exe).unwrap()));
    fs::write(&exe, b"two!").unwrap();
    exe_digest(&exe, &base).unwrap();
    let second = base.join(DIGESTS).join(identity(&fs::metadata(&exe).unwrap()));
    assert!(first.exists() && second.exists());
    set_mtime(&first, SystemTime::now() - UNUSED_FOR - Duration::from_secs(1));
    let pruned = prune(&base).unwrap();
    assert_eq!(pruned.digests_removed, 1);
    assert!(!first.exists() && second.exists());
    // A hit touches the memo, so one in use does not age out.
    set_mtime(&second, SystemTime::now() - UNUSED_FOR + Duration::from_secs(60));
    exe_digest(&exe, &base).unwrap();
    let age = SystemTime::now().duration_since(fs::metadata(&second).unwrap().modified().unwrap()).unwrap();
    assert!(age < Duration::from_secs(60), "{age:?}");
}

#[test]
fn leftovers_go_once_old_and_unheld_and_nothing_is_followed() {
    let t = tempfile::tempdir().unwrap();
    let base = t.path().join("base");
    fs::create_dir(&base).unwrap();
    fs::set_permissions(&base, fs::Permissions::from_mode(0o700)).unwrap();
    let victim = t.path().join("victim");
    fs::create_dir(&victim).unwrap();
    fs::write(victim.join("keep"), b"k").unwrap();
    let old = SystemTime::now() - DEBRIS_AGE - Duration::from_secs(1);
    // A crash's temporary dir, with symlinks out of the base inside it.
    let crashed = base.join(".tmp-bundle-0123456789abcdef-1-00000001");
    fs::create_dir_all(crashed.join("lib")).unwrap();
    std::os::unix::fs::symlink(&victim, crashed.join("lib/dir")).unwrap();
    std::os::unix::fs::symlink(victim.join("keep"), crashed.join("file")).unwrap();
    fs::write(crashed.join("lib/x"), b"12345").unwrap();
    set_mtime(&crashed, old);
    // A preparer at work: old, but held.
    let busy = base.join(".tmp-bundle-0123456789abcdef-2-00000002");
    fs::create_dir(&busy).unwrap();
    set_mtime(&busy, old);
    let held = Flock::lock(fs::File::open(&busy).unwrap(), FlockArg::LockExclusive).unwrap();
    // Too recent to judge.
    let recent = base.join(".trash-bundle-0123456789abcdef-00000003");
    fs::create_dir(&recent).unwrap();
    // A symlink where a bundle would be, and one where a leftover would be: left alone.
    std::os::unix::fs::symlink(&victim, base.join("bundle-0123456789abcdef")).unwrap();
    std::os::unix::fs::symlink(&victim, base.join(".trash-x")).unwrap();
    let pruned = prune(&base).unwrap();
    assert_eq!(pruned.removed, [(".tmp-bundle-0123456789abcdef-1-00000001".to_owned(), "leftover")]);
    assert_eq!(pruned.freed_bytes, 5);
    assert!(!crashed.exists());
    assert!(busy.exists() && recent.exists());
    assert_eq!(fs::read(victim.join("keep")).unwrap(), b"k");
    assert!(base.join("bundle-0123456789abcdef").is_symlink());
    drop(held);
    assert_eq!(prune(&base).unwrap().removed.len(), 1, "no longer held");
    assert!(!busy.exists());
}

#[test]
fn a_dir_of_another_user_inside_is_not_emptied() {
    if !nix::unistd::geteuid().is_root() {
        crate::util::test_skip("needs root to chown");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let base = t.path().join("base");
    fs::create_dir(&base).unwrap();
    fs::set_permissions(&base, fs::Permissions::from_mode(0o700)).unwrap();
    let crashed = base.join(".trash-bundle-0123456789abcdef-00000001");
    fs::create_dir_all(crashed.join("theirs")).unwrap();
    fs::write(crashed.join("theirs/f"), b"f").unwrap();
    nix::unistd::chown(&crashed.join("theirs"), Some(nix::unistd::Uid::from_raw(1000)), None).unwrap();
    set_mtime(&crashed, SystemTime::now() - DEBRIS_AGE - Duration::from_secs(1));
    let pruned = prune(&base).unwrap();
    assert!(pruned.removed.is_empty(), "{pruned:?}");
    assert!(crashed.join("theirs/f").exists());
}

#[test]
fn parses_ldd_output() {
    let exe = Path::new("/x");
    let out = "\tlinux-vdso.so.1 (0x00007ffc)\n\
               \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f60)\n\
               \tld-linux-x86-64.so.2 => /lib64/ld-linux-x86-64.so.2 (0x00007f61)\n\
               \t/lib64/ld-linux-x86-64.so.2 (0x00007f60c72d8000)\n";
    let Linkage::Dynamic { loader, libs } = parse_ldd(exe, true, out, "").unwrap() else { panic!("static") };
    assert_eq!(loader, PathBuf::from("/lib64/ld-linux-x86-64.so.2"));
    assert_eq!(libs.keys().collect::<Vec<_>>(), vec!["libgcc_s.so.1"]);
    assert_eq!(parse_ldd(exe, false, "", "\tnot a dynamic executable\n").unwrap(), Linkage::Static);
    assert_eq!(parse_ldd(exe, true, "\tstatically linked\n", "").unwrap(), Linkage::Static);
    assert!(matches!(
        parse_ldd(exe, true, "\tlibfoo.so.1 => not found\n", ""),
        Err(BundleError::MissingLibrary { .. })
    ));
}

#[test]
fn a_base_of_another_user_is_refused_and_an_open_one_of_ours_is_tightened() {
    let t = tempfile::tempdir().unwrap();
    let ours = t.path().join("ours");
    fs::create_dir(&ours).unwrap();
    fs::set_permissions(&ours, fs::Permissions::from_mode(0o777)).unwrap();
    ExeBundle::prepare(Path::new("/bin/sh"), &ours).unwrap();
    assert_eq!(mode(&ours), 0o700);
    // A base in a shared dir (as a temp dir in /tmp is): the shared dir is left as it was.
    let shared = t.path().join("shared");
    fs::create_dir(&shared).unwrap();
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o1777)).unwrap();
    ExeBundle::prepare(Path::new("/bin/sh"), &shared.join("bundles")).unwrap();
    assert_eq!(fs::metadata(&shared).unwrap().mode() & 0o7777, 0o1777);
    if nix::unistd::geteuid().is_root() {
        let theirs = t.path().join("theirs");
        fs::create_dir(&theirs).unwrap();
        nix::unistd::chown(&theirs, Some(nix::unistd::Uid::from_raw(1000)), None).unwrap();
        let err = ExeBundle::prepare(Path::new("/bin/sh"), &theirs);
        assert!(matches!(err, Err(BundleError::Untrusted { .. })), "{err:?}");
    }
}

#[test]
fn the_bundle_dir_is_the_one_the_environment_names_when_absolute() {
    let default = crate::hostdir::default_base().join("bundles");
    assert_eq!(place::base_from(Some("/var/cache/sd-bundles".into())), Path::new("/var/cache/sd-bundles"));
    assert_eq!(place::base_from(Some("relative/dir".into())), default, "a relative dir is ignored");
    assert_eq!(place::base_from(Some("".into())), default);
    assert_eq!(place::base_from(None), default);
}

/// The prepare that makes a bundle says so, with its size and the cache's after the
/// pruning; one that finds it says nothing.
#[test]
fn a_prepare_that_grows_the_cache_says_where_and_how_much() {
    let busybox = Path::new("/bin/busybox");
    if !busybox.exists() {
        crate::util::test_skip("/bin/busybox missing (install busybox-static)");
        return;
    }
    let base = tempfile::tempdir().unwrap();
    let first = ExeBundle::prepare(busybox, base.path()).unwrap();
    let added = first.added().expect("a new bundle").clone();
    let size = fs::metadata(busybox).unwrap().len();
    assert_eq!(added.dir.as_path(), first.host_dir());
    assert!((size..size + 4096).contains(&added.bytes), "the exe and the bookkeeping: {} of {size}", added.bytes);
    assert_eq!(added.cache_bytes, added.bytes, "the only bundle, held, counts");
    assert_eq!(added.cap_bytes, cap_bytes());
    let again = ExeBundle::prepare(busybox, base.path()).unwrap();
    assert_eq!(again.added(), None, "found in the cache: it did not grow");
}
