//! Replays the host's fuzz corpora (`fuzz/corpus/<target>/`, and `fuzz/artifacts/<target>/`
//! when present) through the fuzz targets' invariants, on stable: a crash the fuzzer once
//! found stays a regression test once its input is in the corpus. The init's targets are
//! replayed by `init/tests/fuzz_corpus.rs`.
//!
//! The seed corpus is written by the ignored test `write_seed_corpus`:
//! `cargo test -p stevedore-parse --test fuzz_corpus -- --ignored write_seed_corpus`.

use std::path::{Path, PathBuf};
use stevedore_init::fuzzing::{Seed, Target};
use stevedore_parse::fuzzing;
use tar::{Builder, EntryType, Header};

const TARGETS: &[Target] =
    &[("extract", fuzzing::extract), ("limits", fuzzing::limits), ("profiles", fuzzing::profiles)];

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("fuzz")
}

#[test]
fn every_target_is_a_fuzz_binary_calling_it() {
    let missing = stevedore_init::fuzzing::unfuzzed(&fuzz_dir(), "stevedore_parse::fuzzing", TARGETS);
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

#[test]
fn corpora_replay_without_breaking_an_invariant() {
    let failed = stevedore_init::fuzzing::replay(&fuzz_dir(), TARGETS);
    assert!(failed.is_empty(), "inputs that break an invariant:\n{}", failed.join("\n"));
}

/// One tar entry: path bytes, type, mode, content (a link's target for links).
struct E<'a>(&'a [u8], EntryType, u32, &'a [u8]);

/// A tar of `entries`, written header by header (so hostile names and types get in).
fn tar(entries: &[E]) -> Vec<u8> {
    let mut b = Builder::new(Vec::new());
    for E(path, kind, mode, data) in entries {
        let mut h = Header::new_gnu();
        h.set_entry_type(*kind);
        h.set_mode(*mode);
        h.set_uid(0);
        h.set_gid(0);
        let name = &mut h.as_old_mut().name;
        name[..path.len()].copy_from_slice(path);
        if matches!(kind, EntryType::Symlink | EntryType::Link) {
            h.set_link_name_literal(std::str::from_utf8(data).unwrap()).unwrap();
            h.set_size(0);
            h.set_cksum();
            b.append(&h, &[][..]).unwrap();
        } else {
            h.set_size(data.len() as u64);
            h.set_cksum();
            b.append(&h, *data).unwrap();
        }
    }
    b.into_inner().unwrap()
}

/// A tar of a real directory tree, as the init sends `/out` (directories, then files).
fn tree_tar() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("reports/junit")).unwrap();
    std::fs::write(dir.path().join("reports/junit/TEST-a.xml"), "<testsuite tests=\"1\"/>\n").unwrap();
    std::fs::write(dir.path().join("result.json"), "{\"ok\":true}\n").unwrap();
    std::fs::write(dir.path().join("thumb.png"), b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR").unwrap();
    let mut b = Builder::new(Vec::new());
    b.mode(tar::HeaderMode::Deterministic);
    b.append_dir_all(".", dir.path()).unwrap();
    b.into_inner().unwrap()
}

/// A GNU sparse entry that claims `real` bytes with a few bytes of data.
fn sparse(real: u64) -> Vec<u8> {
    let mut h = Header::new_gnu();
    h.set_path("sparse.bin").unwrap();
    h.set_entry_type(EntryType::GNUSparse);
    h.set_mode(0o644);
    h.set_size(512);
    let gnu = h.as_gnu_mut().unwrap();
    gnu.set_real_size(real);
    gnu.sparse[0].set_offset(real - 512);
    gnu.sparse[0].set_length(512);
    h.set_cksum();
    let mut b = Builder::new(Vec::new());
    b.append(&h, &[7u8; 512][..]).unwrap();
    b.into_inner().unwrap()
}

/// The seed corpus: hostile and ordinary outputs tars, the sizes and durations people type,
/// profiles files like the documented one.
fn seeds() -> Vec<Seed> {
    use EntryType::*;
    let caps = |files: u8, bytes: u8, tar: Vec<u8>| [&[files, bytes][..], &tar].concat();
    let long = [b"d/".repeat(60), b"long.txt".to_vec()].concat();
    let mut long_tar = Builder::new(Vec::new());
    let mut h = Header::new_gnu();
    h.set_size(3);
    h.set_mode(0o644);
    long_tar.append_data(&mut h, Path::new(std::str::from_utf8(&long).unwrap()), &b"abc"[..]).unwrap();
    let long_tar = long_tar.into_inner().unwrap();
    let truncated = {
        let t = tree_tar();
        t[..t.len() / 2 + 100].to_vec()
    };
    let doc = b"# dev\n[profiles.dev]\nimage = \"stevedore-worker:latest\"\nruntime = \"runc\"\n\
        network = \"bridge\"\nallow_networks = [\"none\"]\nuser = \"65532:65532\"\nlog_cap = \"4m\"\n\
        pull = \"never\"\nmax_in_flight = 4\nwait_for_admission = true\nlabels = { team = \"infra\" }\n\
        ports = { \"8080\" = 0 }\nallow_publish = true\nallow_root = false\n\
        caches = { cargo = \"/cache/cargo\" }\nallow_caches = true\npool = { size = 2, worker = \"w1\" }\n\
        background_cleanup = false\nenv = { RUST_LOG = \"info\" }\n\
        defaults = { memory = \"256m\", cpus = \"1\", pids = 128, disk = \"100m\" }\n\
        ceilings = { memory = \"1g\", cpus = \"2\" }\n";
    let mut seeds = vec![
        // extract: [max files - 1 (mod 8)][max bytes / 256][tar]
        ("extract", "tree", caps(7, 255, tree_tar())),
        ("extract", "tree_over_files", caps(1, 255, tree_tar())),
        ("extract", "tree_over_bytes", caps(7, 0, tree_tar())),
        ("extract", "tree_truncated", caps(7, 255, truncated)),
        ("extract", "long_name", caps(7, 255, long_tar)),
        ("extract", "sparse_1tib", caps(7, 255, sparse(1 << 40))),
        (
            "extract",
            "links_and_specials",
            caps(
                7,
                255,
                tar(&[
                    E(b"etc", Symlink, 0o777, b"/etc"),
                    E(b"etc/passwd", Regular, 0o644, b"root::0:0::/:/bin/sh\n"),
                    E(b"hard", Link, 0o644, b"/etc/shadow"),
                    E(b"fifo", Fifo, 0o644, b""),
                    E(b"null", Char, 0o666, b""),
                    E(b"sda", Block, 0o660, b""),
                ]),
            ),
        ),
        (
            "extract",
            "escapes",
            caps(
                7,
                255,
                tar(&[
                    E(b"../escape", Regular, 0o644, b"x"),
                    E(b"/abs", Regular, 0o644, b"x"),
                    E(b"a/../../up", Regular, 0o644, b"x"),
                    E(b"./ok", Regular, 0o4777, b"ok"),
                    E(b"bad\xffname", Regular, 0o644, b"x"),
                ]),
            ),
        ),
        (
            "extract",
            "conflicts",
            caps(
                7,
                255,
                tar(&[
                    E(b"a", Regular, 0o644, b"file"),
                    E(b"a/b", Regular, 0o644, b"under a file"),
                    E(b"a", Directory, 0o755, b""),
                    E(b"d", Directory, 0o777, b""),
                    E(b"d", Regular, 0o644, b"over a dir"),
                    E(b"f", Regular, 0o755, b"one"),
                    E(b"f", Regular, 0o644, b"two"),
                ]),
            ),
        ),
        // limits: what people type after --memory, --cpus, --timeout
        ("limits", "size_64m", b"64m".to_vec()),
        ("limits", "size_64mib", b"64MiB".to_vec()),
        ("limits", "size_float", b"1.5g".to_vec()),
        ("limits", "size_plain", b"1048576".to_vec()),
        ("limits", "size_max", b"18446744073709551615".to_vec()),
        ("limits", "size_overflow", b"16777216t".to_vec()),
        ("limits", "cpus_half", b"0.5".to_vec()),
        ("limits", "cpus_milli", b"500m".to_vec()),
        ("limits", "duration_ms", b"123ms".to_vec()),
        ("limits", "duration_s", b" 10s ".to_vec()),
        ("limits", "duration_fraction", b"0.1s".to_vec()),
        ("limits", "duration_h", b"1h".to_vec()),
        ("limits", "duration_huge", b"99999999999999999999h".to_vec()),
        ("limits", "exponent", b"1e3".to_vec()),
        ("limits", "dots", b"1..5m".to_vec()),
        // profiles: a profiles file; its first line `# name` picks the profile
        ("profiles", "documented", doc.to_vec()),
        ("profiles", "bad_value", b"# a\n[profiles.a]\ndefaults = { memory = \"lots\" }\n".to_vec()),
        ("profiles", "unknown_key", b"# dev\n[profiles.dev]\nnetwrok = \"bridge\"\n".to_vec()),
        ("profiles", "unknown_profile", b"# c\n[profiles.a]\n[profiles.b]\n".to_vec()),
        ("profiles", "zero_port", b"# a\n[profiles.a]\nports = { \"80\" = 0, \"x\" = 1 }\n".to_vec()),
        ("profiles", "not_toml", b"# a\n[profiles.a\n".to_vec()),
    ];
    seeds.push(("profiles", "pool_without_worker", b"# a\n[profiles.a]\npool = { size = 2 }\n".to_vec()));
    seeds
}

#[test]
#[ignore = "writes the seed corpus into fuzz/corpus"]
fn write_seed_corpus() {
    stevedore_init::fuzzing::write_seeds(&fuzz_dir(), &seeds()).unwrap();
}

#[test]
fn seeds_pass_their_targets() {
    let failed = stevedore_init::fuzzing::check_seeds(TARGETS, &seeds());
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
