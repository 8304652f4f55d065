//! Replays the fuzz corpora (`fuzz/corpus/<target>/`, and `fuzz/artifacts/<target>/` when
//! present) through the fuzz targets' invariants, on stable: a crash the fuzzer once found
//! stays a regression test once its input is in the corpus.
//!
//! The seed corpus is written by the ignored test `write_seed_corpus`:
//! `cargo test -p stevedore-init --test fuzz_corpus -- --ignored write_seed_corpus`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use stevedore_init::fuzzing::{self, Seed, Target};
use stevedore_init::report::Report;
use stevedore_init::wire::{self, InitRecord, Kind};

const TARGETS: &[Target] = &[
    ("frames", fuzzing::frames),
    ("start", fuzzing::start),
    ("record", fuzzing::record),
    ("report", fuzzing::report),
    ("cgroup", fuzzing::cgroup),
    ("takeover", fuzzing::takeover),
];

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("fuzz")
}

#[test]
fn every_target_is_a_fuzz_binary_calling_it() {
    let missing = stevedore_init::fuzzing::unfuzzed(&fuzz_dir(), "stevedore_init::fuzzing", TARGETS);
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

#[test]
fn corpora_replay_without_breaking_an_invariant() {
    let failed = stevedore_init::fuzzing::replay(&fuzz_dir(), TARGETS);
    assert!(failed.is_empty(), "inputs that break an invariant:\n{}", failed.join("\n"));
}

fn start() -> wire::Start {
    wire::Start {
        protocol: wire::PROTOCOL,
        key: "ab".repeat(wire::KEY_LEN),
        argv: vec!["sh".into(), "-c".into(), "echo hi; sleep 1".into()],
        env: vec![("PATH".into(), "/usr/bin:/bin".into()), ("LANG".into(), "C.UTF-8".into())],
        cwd: "/work".into(),
        grace_ms: 10_000,
        child_oom_score_adj: Some(500),
        handler: None,
        handshake_ms: 5_000,
        heartbeat_timeout_ms: 30_000,
        host_loss_grace_ms: 60_000,
        outputs: wire::OutputSpec {
            dir: "/out".into(),
            max_files: 1000,
            max_bytes: 1 << 30,
            collect_min_ms: 30_000,
            collect_bytes_per_s: 32 << 20,
            host_walks: false,
        },
        scope: wire::Scope { job_id: "job-1".into(), attempt: 1 },
        link_id: Some("0f".repeat(16)),
        takeover_uid: Some(1000),
        takeover_fd: Some(3),
        rlimits: vec![wire::Rlimit { resource: wire::RlimitResource::Nofile, soft: 1024, hard: 4096 }],
        cgroup_dir: Some("/sys/fs/cgroup".into()),
        measure: vec!["/cache/cargo".into()],
        timeline: Some(wire::TimelineSpec {
            period_ms: 100,
            max_samples: 192,
            cgroup: None,
            out_dir: Some("/out".into()),
            tmp_dir: Some("/tmp".into()),
        }),
        mounts: vec!["/.stevedore/tools".into(), "/in".into(), "/out".into(), "/tmp".into()],
        stdin: true,
        tty: Some(wire::TermSize { rows: 24, cols: 80 }),
        image_env: None,
        credentials: None,
        held: vec![
            wire::Held { limit: wire::HeldLimit::Memory, at_most: 72 << 20 },
            wire::Held { limit: wire::HeldLimit::Pids, at_most: 512 },
        ],
    }
}

/// The right proof for the `takeover` target's picks (see `fuzzing::takeover`).
fn proof(link: u8, nonce: u8, resume: u8) -> Vec<u8> {
    let link_id: String = std::iter::repeat_n(char::from(b'a' + link % 6), 32).collect();
    wire::takeover_proof(
        &stevedore_init::fuzzing::FUZZ_KEY,
        &link_id,
        &[nonce; wire::NONCE_LEN],
        u64::from(resume) << 24,
    )
}

fn handler_start() -> wire::Start {
    let mut s = start();
    s.argv = vec!["/usr/local/bin/worker".into(), wire::HANDLER_MARKER.into()];
    s.handler = Some(wire::HandlerRequest {
        handler: "resize".into(),
        fingerprint: Some("f00d".into()),
        job_id: "job-1".into(),
        attempt: 1,
        inputs: BTreeMap::from([("image".into(), "/in/image.png".into())]),
        prior_outputs: vec![wire::PriorOutput { name: "thumb".into(), reference: "sha256:00".into() }],
        deadline_ms: Some(60_000),
    });
    s.rlimits.push(wire::Rlimit { resource: wire::RlimitResource::Fsize, soft: 1 << 20, hard: 1 << 20 });
    s
}

fn init_record() -> InitRecord {
    InitRecord {
        wait: wire::WaitStatus::Code(0),
        stopped_by: None,
        stragglers_killed: 1,
        wall_time_ms: 1234,
        cgroup: wire::CgroupCounters {
            version: Some(2),
            memory_peak_bytes: Some(1 << 20),
            memory_limit_bytes: None,
            oom_kills: Some(0),
            cpu_usage_ns: Some(123_456_000),
            pids_limit: Some(512),
            cpu_limit_millis: Some(500),
            missing: BTreeMap::from([("memory_limit_bytes".into(), "memory.max says no limit".into())]),
        },
        rusage: wire::ChildrenRusage { user_us: 1000, system_us: 200, max_rss_kib: 4096 },
        out_fs: Some(wire::FsSpace { total_bytes: 1 << 30, free_bytes: 1 << 29 }),
        oom_guard: None,
        handler: None,
        stdout_bytes: 3,
        stderr_bytes: 0,
        host_lost: false,
        takeovers: 0,
        reports: wire::ReportCounts {
            forwarded: 2,
            refused: 1,
            refusals: vec!["not JSON".into()],
            ..Default::default()
        },
        measured: vec![wire::Measured {
            path: "/cache/cargo".into(),
            seen: wire::OutScan { files: 2, apparent_bytes: 10, written_bytes: 10, truncated: false },
        }],
        timeline: Some(wire::Timeline {
            first_period_ms: 100,
            period_ms: 200,
            t_ms: vec![0, 200, 400],
            memory_bytes: vec![1 << 20, 2 << 20, 3 << 20],
            cpu_ms: vec![0, 150, 310],
            pids: vec![1, 2, 2],
            out_bytes: vec![0, 4096, 8192],
            tmp_bytes: Vec::new(),
            oom_kill_ms: Some(400),
            missing: [("tmp_bytes".to_owned(), "/tmp is not a filesystem of its own".to_owned())].into(),
        }),
        reserve_bytes: 8 << 20,
        credentials: None,
        kernel: None,
        program: Some("/bin/busybox".into()),
        program_name: Some("true".into()),
        read_ahead: Some(stevedore_init::warm::ReadAhead {
            uid: 65532,
            names: 1,
            files: 1,
            bytes: 2_157_288,
            ms: 3,
            ..Default::default()
        }),
    }
}

fn handler_init_record() -> InitRecord {
    InitRecord {
        wait: wire::WaitStatus::SpawnFailed(wire::SpawnFailure {
            kind: wire::SpawnFailureKind::NotFound,
            message: "No such file or directory".into(),
        }),
        stopped_by: Some(wire::StoppedBy::Handshake),
        handler: Some(wire::HandlerChannel {
            hello: Some(wire::HandlerHello { protocol: wire::PROTOCOL, fingerprint: "f00d".into() }),
            record: Some(handler_record()),
            refused: vec!["unexpected frame Stdout".into()],
        }),
        host_lost: true,
        takeovers: 1,
        ..init_record()
    }
}

fn handler_record() -> wire::HandlerRecord {
    wire::HandlerRecord {
        result: wire::HandlerResult::LaunchFailed,
        error: "no handler \"resize\"".into(),
        permanent: true,
        fingerprint: "f00d".into(),
        launch: Some(wire::LaunchFailure::UnknownHandler),
    }
}

fn json(v: &impl serde::Serialize) -> Vec<u8> {
    serde_json::to_vec(v).unwrap()
}

/// The seed corpus: real messages from the init's own encoders, real cgroup files, the
/// reports of the report tests.
fn seeds() -> Vec<Seed> {
    let key = fuzzing::FUZZ_KEY;
    let start_frame = wire::encode_start(&start(), b"pay\nload");
    let report = |r: &Report| json(r);
    let mut link = start_frame.clone();
    link.extend(wire::encode(Kind::Heartbeat, b""));
    link.extend(wire::encode(Kind::Heartbeat, &wire::heartbeat_body(3)));
    link.extend(wire::encode(Kind::Stdin, &wire::stdin_body(0, b"typed\n")));
    link.extend(wire::encode(Kind::Resize, &wire::resize_body(wire::TermSize { rows: 40, cols: 120 })));
    link.extend(wire::encode(Kind::StdinEnd, &6u64.to_be_bytes()));
    link.extend(wire::encode(Kind::Stop, b""));
    link.extend(wire::encode(Kind::Ack, b""));
    let mut out = wire::encode(
        Kind::Started,
        &json(&wire::Started {
            pid: 7,
            init_version: "0.1.0".into(),
            resumed: false,
            ended: false,
            from: 0,
            kernel: None,
        }),
    );
    out.extend(wire::encode(Kind::Stdout, b"hello\n"));
    out.extend(wire::encode(Kind::Stderr, b"warning: x\n"));
    out.extend(wire::encode(Kind::StdinTaken, &6u64.to_be_bytes()));
    out.extend(wire::encode(Kind::Report, &report(&Report::progress(40.0, Some("half way".into())))));
    out.extend(wire::encode(Kind::Record, &wire::seal(&key, &json(&init_record()))));
    out.extend(wire::encode(Kind::Output, b"ustar-ish chunk"));
    out.extend(wire::encode(Kind::OutputEnd, &json(&wire::OutputEnd::default())));
    let mut handler = wire::encode(
        Kind::HandlerHello,
        &json(&wire::HandlerHello { protocol: wire::PROTOCOL, fingerprint: "f00d".into() }),
    );
    handler.extend(wire::encode(Kind::HandlerRequest, &json(handler_start().handler.as_ref().unwrap())));
    handler.extend(wire::encode(Kind::HandlerPayload, b"\x89PNG"));
    handler.extend(wire::encode(Kind::HandlerRecord, &json(&handler_record())));
    let link_id = "0f".repeat(16);
    let mut takeover = wire::encode(Kind::Takeover, &wire::takeover_proof(&key, &link_id, &[7; 32], 0));
    takeover.extend(wire::encode(Kind::Diag, b"init: host back"));
    let with = |sel: u8, bytes: &[u8]| [&[sel][..], bytes].concat();

    let mut seeds = vec![
        // frames: [piece size - 1][stream]
        ("frames", "host_to_init", with(255, &link)),
        ("frames", "host_to_init_split_3", with(2, &link)),
        ("frames", "init_to_host", with(16, &out)),
        ("frames", "handler_channel", with(0, &handler)),
        ("frames", "takeover", with(9, &takeover)),
        ("frames", "unknown_kind", with(255, &[wire::encode(Kind::Stdout, b"x"), vec![0x7f, 0, 0, 0, 0]].concat())),
        ("frames", "too_large", with(255, &[Kind::Stdout as u8, 0xff, 0xff, 0xff, 0xff])),
        ("frames", "truncated", with(4, &out[..out.len() - 3])),
        // start: a Start frame's body
        ("start", "plain", start_frame[wire::HEADER_LEN..].to_vec()),
        ("start", "handler", wire::encode_start(&handler_start(), b"{\"w\":64}")[wire::HEADER_LEN..].to_vec()),
        ("start", "old_protocol", {
            let mut s = start();
            s.protocol = 2;
            wire::encode_start(&s, b"")[wire::HEADER_LEN..].to_vec()
        }),
        ("start", "truncated", start_frame[wire::HEADER_LEN..40].to_vec()),
        // record: a Record body sealed with FUZZ_KEY, or a claim's JSON
        ("record", "sealed_init_record", wire::seal(&key, &json(&init_record()))),
        ("record", "sealed_handler_init_record", wire::seal(&key, &json(&handler_init_record()))),
        ("record", "init_record", json(&init_record())),
        ("record", "handler_init_record", json(&handler_init_record())),
        ("record", "handler_record", json(&handler_record())),
        ("record", "handler_record_ok", br#"{"result":"ok","error":"","permanent":false,"fingerprint":"x"}"#.to_vec()),
        (
            "record",
            "started",
            json(&wire::Started {
                pid: 7,
                init_version: "0.1.0".into(),
                resumed: true,
                ended: true,
                from: 0,
                kernel: None,
            }),
        ),
        (
            "record",
            "output_end",
            json(&wire::OutputEnd {
                files: 2,
                bytes: 10,
                refused: vec![wire::Refused { name: "link".into(), why: "symlink".into() }],
                over_cap: true,
                error: None,
                seen: wire::OutScan { files: 3, apparent_bytes: 1 << 40, written_bytes: 10, truncated: false },
                budget_bytes: 512 << 20,
                deadline_ms: Some(30_016),
                deadline_hit: false,
            }),
        ),
        ("record", "bad_mac", wire::seal(&[0; 32], &json(&init_record()))),
        // report: a report's JSON, or the report client's words
        ("report", "progress", report(&Report::progress(40.0, Some("half way".into())))),
        ("report", "progress_over", report(&Report::progress(100.5, None))),
        ("report", "heartbeat", report(&Report::heartbeat())),
        ("report", "note", report(&Report::note("hi\tthere"))),
        ("report", "note_escape", report(&Report::note("a\u{1b}[2J"))),
        ("report", "data", report(&Report::data(serde_json::json!({"a": 1, "b": [1.5, "x", null, true]})))),
        ("report", "scoped", br#"{"kind":"note","text":"x","job_id":"job","attempt":2}"#.to_vec()),
        ("report", "other_attempt", br#"{"kind":"note","text":"x","job_id":"job","attempt":1}"#.to_vec()),
        ("report", "unknown_field", br#"{"kind":"heartbeat","evil":1}"#.to_vec()),
        ("report", "args_progress", b"progress 40% half way".to_vec()),
        ("report", "args_scoped", b"--job j --attempt 3 note hello".to_vec()),
        ("report", "args_data", b"data {\"a\":1}".to_vec()),
        ("report", "args_heartbeat", b"heartbeat".to_vec()),
        // cgroup: cgroup file contents (v1 and v2, this machine's and the unit tests')
        ("cgroup", "v1_max_usage_in_bytes", b"19153108992\n".to_vec()),
        ("cgroup", "v1_limit_unlimited", b"9223372036854771712\n".to_vec()),
        ("cgroup", "v1_limit_32m", b"33554432\n".to_vec()),
        ("cgroup", "v1_oom_control", b"oom_kill_disable 0\nunder_oom 0\noom_kill 0\n".to_vec()),
        ("cgroup", "v1_oom_control_old_kernel", b"oom_kill_disable 0\nunder_oom 0\n".to_vec()),
        ("cgroup", "v1_cpuacct_usage", b"18498330455643\n".to_vec()),
        ("cgroup", "v2_memory_max", b"max\n".to_vec()),
        ("cgroup", "v2_memory_events", b"low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n".to_vec()),
        (
            "cgroup",
            "v2_cpu_stat",
            b"usage_usec 18470059907\nuser_usec 15086669450\nsystem_usec 3383390457\nnice_usec 0\n".to_vec(),
        ),
        ("cgroup", "garbage", b"garbage\n".to_vec()),
        ("cgroup", "negative", b"-1\n".to_vec()),
        // takeover: [link id byte][nonce byte][resume byte][proof]
        ("takeover", "right", [&[0u8, 7, 0][..], &proof(0, 7, 0)].concat()),
        ("takeover", "right_resumed", [&[3u8, 9, 2][..], &proof(3, 9, 2)].concat()),
        ("takeover", "wrong_link", [&[1u8, 7, 0][..], &proof(0, 7, 0)].concat()),
        ("takeover", "wrong_resume", [&[0u8, 7, 1][..], &proof(0, 7, 0)].concat()),
        ("takeover", "short", [&[0u8, 7, 0][..], &proof(0, 7, 0)[..wire::TAKEOVER_LEN - 1]].concat()),
        ("takeover", "key_hex", "ab".repeat(32).into_bytes()),
        ("takeover", "link_id", "0f".repeat(16).into_bytes()),
    ];
    // memory.stat of this machine's cgroup, when it has one (v1).
    if let Ok(stat) = std::fs::read("/sys/fs/cgroup/memory/memory.stat") {
        seeds.push(("cgroup", "v1_memory_stat", stat));
    }
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
