//! The suite's record of what it did not run: each skip, by test and why, appended to the
//! file `STEVEDORE_TEST_SKIP_LOG` names (`.ci/run` lists them all, per stage, at its end).

use crate::support::{self, guard::SKIP_LOG, guard::record_skip};
use std::process::Command;

#[test]
fn each_skip_is_one_whole_line_of_the_test_and_why() {
    let t = tempfile::tempdir().unwrap();
    let log = t.path().join("skips.tsv");
    // Tests skip at once on many threads: each line stays whole.
    std::thread::scope(|s| {
        for i in 0..8 {
            let log = &log;
            s.spawn(move || record_skip(log, &format!("area::test_{i}"), "no Docker engine").unwrap());
        }
    });
    record_skip(&log, "page::a_test", "a reason\twith a tab\nand a line break").unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort_unstable();
    let mut expected: Vec<String> = (0..8).map(|i| format!("area::test_{i}\tno Docker engine")).collect();
    expected.push("page::a_test\ta reason with a tab and a line break".into());
    expected.sort_unstable();
    assert_eq!(lines, expected);
}

/// The suite's own binary, asked for one test that skips here (the engines' long cases under
/// `STEVEDORE_ENGINE_SUITE=quick`), on many threads and on one: the file names that test.
#[test]
fn a_skipped_test_names_itself_in_the_log() {
    support::time_limit();
    let test = "engines::oom_disk_limit_and_usage_are_the_kernels";
    for threads in ["2", "1"] {
        let t = tempfile::tempdir().unwrap();
        let log = t.path().join("skips.tsv");
        let o = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", test, "--test-threads", threads])
            .env("STEVEDORE_ENGINE_SUITE", "quick")
            .env(SKIP_LOG, &log)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{stderr}");
        assert!(stderr.contains("SKIPPED: 1 tests passed without running"), "{stderr}");
        let text = std::fs::read_to_string(&log).unwrap();
        let (name, why) = text.trim_end().split_once('\t').unwrap_or_else(|| panic!("{text:?}"));
        assert_eq!((name, text.lines().count()), (test, 1), "{threads} threads: {text:?}");
        assert!(why.starts_with("STEVEDORE_ENGINE_SUITE=quick"), "{why}");
    }
}
