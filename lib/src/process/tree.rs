//! The process tree of an attempt on the host: which process its init is (pid and start
//! time, so a reused pid is not mistaken for it), and how everything of it is SIGKILLed.
//! Reads `/proc`; imports nothing of the rung but its cgroup.

use super::cgroup::Cgroup;
use std::time::{Duration, Instant};

/// The file in an attempt's dir naming its init (`<pid> <start ticks> <uid>`).
pub(crate) const PID_FILE: &str = "init.pid";

/// `/proc/<pid>/stat` field 22: when the process started, in clock ticks since boot.
pub(crate) fn start_ticks(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()
}

/// SIGKILLs the init and what it runs: the cgroup's processes, or those of the sessions its
/// children lead.
pub(crate) fn kill_tree(init_pid: i32, cgroup: Option<&Cgroup>) {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    if let Some(c) = cgroup {
        c.kill_all();
    }
    let mut sessions = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else { return };
    let stats: Vec<(i32, i32, i32)> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let (ppid, sid) = parent_and_session(&stat)?;
            Some((pid, ppid, sid))
        })
        .collect();
    for &(pid, ppid, _) in &stats {
        if ppid == init_pid {
            sessions.push(pid);
        }
    }
    let _ = kill(Pid::from_raw(init_pid), Signal::SIGKILL);
    for &(pid, _, sid) in &stats {
        if sessions.contains(&sid) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// Waits (bounded) for a process that is not our child to exit; then kills what is left.
pub(crate) async fn wait_gone(pid: i32, ticks: u64, within: Duration, cgroup: Option<&Cgroup>) {
    let until = Instant::now() + within;
    while start_ticks(pid) == Some(ticks) {
        if Instant::now() >= until {
            kill_tree(pid, cgroup);
            return;
        }
        // Not our child: there is no exit to wait on, only /proc to look at.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `/proc/<pid>/stat` of a process: its parent and its session, after the command name
/// (which may hold spaces and parentheses).
fn parent_and_session(stat: &str) -> Option<(i32, i32)> {
    let mut f = stat.rsplit_once(')')?.1.split_whitespace();
    let ppid = f.nth(1)?.parse().ok()?;
    let sid = f.nth(1)?.parse().ok()?;
    Some((ppid, sid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_found_by_its_start_time() {
        let me = std::process::id() as i32;
        let ticks = start_ticks(me).expect("this process has a start time");
        assert_eq!(start_ticks(me), Some(ticks), "the same process, the same start");
        assert_eq!(start_ticks(i32::MAX), None, "no such process");
    }

    #[test]
    fn a_command_name_with_parentheses_does_not_move_the_fields() {
        let stat = "42 (a) b (c) S 7 42 42 0 -1";
        assert_eq!(parent_and_session(stat), Some((7, 42)));
    }
}
