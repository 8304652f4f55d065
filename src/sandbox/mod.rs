//! What runs inside the container: stevedore's init (PID 1) and the handler runner.

pub mod cgroup;
pub mod init;
