//! The wire between the host and stevedore's code inside the container: paths, the stdin
//! frame, the init's result record and the handler's record.
//!
//! Everything that comes back from inside is an untrusted claim: the host reads it with a
//! size cap and a strict parser ([`parse_claim`]) and bound-checks every figure.

use serde::{Deserialize, Serialize, de::DeserializeOwned};
use std::collections::BTreeMap;
use std::io::{self, BufRead, Read};

/// The marker argument that makes a worker binary act as the container's init (PID 1).
pub const INIT_MARKER: &str = "__stevedore_init";
/// The marker argument that makes a worker binary run one handler from the control area.
pub const HANDLER_MARKER: &str = "__stevedore_handler";

/// Where stevedore's read-only tools (the init and its loader and libraries) are mounted.
pub const TOOLS_DIR: &str = "/.stevedore/tools";
/// The control area: request, payload and result records. Not `/out`.
pub const CONTROL_DIR: &str = "/.stevedore/control";
/// The inputs, read-only.
pub const IN_DIR: &str = "/in";
/// The outputs, writable.
pub const OUT_DIR: &str = "/out";
/// Scratch space, a size-limited tmpfs.
pub const TMP_DIR: &str = "/tmp";

/// File in the control area holding the [`HandlerRequest`].
pub const REQUEST_FILE: &str = "request.json";
/// File in the control area holding the payload bytes.
pub const PAYLOAD_FILE: &str = "payload";
/// File in the control area holding the [`HandlerRecord`].
pub const HANDLER_FILE: &str = "handler.json";
/// File in the control area holding the [`InitRecord`].
pub const RESULT_FILE: &str = "result.json";

/// The largest record the host accepts from inside.
pub const MAX_RECORD_BYTES: u64 = 256 << 10;
/// The longest handler error text kept.
pub const MAX_ERROR_TEXT: usize = 16 << 10;

/// Environment variables stevedore sets for the handler or command; a request cannot
/// override them.
pub mod env {
    /// The job ID.
    pub const JOB_ID: &str = "STEVEDORE_JOB_ID";
    /// The attempt number.
    pub const ATTEMPT: &str = "STEVEDORE_ATTEMPT";
    /// The input dir inside the sandbox.
    pub const IN: &str = "STEVEDORE_IN";
    /// The output dir inside the sandbox.
    pub const OUT: &str = "STEVEDORE_OUT";
    /// The control dir inside the sandbox.
    pub const CONTROL: &str = "STEVEDORE_CONTROL";
    /// All the protocol variables.
    pub const ALL: &[&str] = &[JOB_ID, ATTEMPT, IN, OUT, CONTROL];
}

/// The first line the host writes on the init's stdin: `STEVEDORE/1 <nonce>`.
pub const STDIN_MAGIC: &str = "STEVEDORE/1";

/// What the init needs to start the command. Sent on its stdin after the magic line as
/// `<len>\n<json>` followed by `<len>\n<payload bytes>`. The stdin stays open: its EOF
/// tells the init that the host is gone (dead-man switch) or done with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InitSpec {
    /// The argv to run (a plain command, or the worker binary with [`HANDLER_MARKER`]).
    pub argv: Vec<String>,
    /// The complete environment of the command (nothing else is inherited).
    pub env: Vec<(String, String)>,
    /// The working directory.
    pub cwd: String,
    /// Time between forwarding SIGTERM and SIGKILLing everything, in ms.
    pub grace_ms: u64,
    /// When set, written to the control area as [`REQUEST_FILE`] for the handler runner.
    pub handler_request: Option<HandlerRequest>,
    /// The OOM score adjustment for the command (the init keeps its own lower).
    pub child_oom_score_adj: Option<i32>,
}

/// What the handler runner reads from [`REQUEST_FILE`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HandlerRequest {
    /// The handler's name.
    pub handler: String,
    /// The fingerprint the caller expects, if any.
    pub fingerprint: Option<String>,
    /// The job ID.
    pub job_id: String,
    /// The attempt number.
    pub attempt: u32,
    /// Named input slots: name → path under [`IN_DIR`].
    pub inputs: BTreeMap<String, String>,
    /// Outputs of earlier steps: name → opaque reference.
    pub prior_outputs: Vec<crate::contract::PriorOutput>,
    /// Milliseconds the handler has from its start, if there is a deadline.
    pub deadline_ms: Option<u64>,
}

/// What the handler runner writes to [`HANDLER_FILE`] (atomically: temp file + rename).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HandlerRecord {
    /// What became of the handler.
    pub result: HandlerResult,
    /// The error text (empty on success).
    pub error: String,
    /// Retrying cannot help.
    pub permanent: bool,
    /// The fingerprint of the handler set inside the sandbox.
    pub fingerprint: String,
}

/// The handler runner's verdict on its handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HandlerResult {
    /// The handler returned `Ok`.
    Ok,
    /// The handler returned an error.
    Error,
    /// The handler panicked.
    Panicked,
    /// The handler could not be started (unknown handler, fingerprint mismatch).
    LaunchFailed,
}

/// How the command ended, as the init saw it through `waitpid`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum WaitStatus {
    /// It exited with this code.
    Code(i32),
    /// A signal killed it.
    Signal(i32),
    /// It could not be started (exec failed), with why.
    SpawnFailed(String),
}

/// Who stopped the command, if the init did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoppedBy {
    /// The init forwarded SIGTERM (from the host) and the command ended within the grace.
    Term,
    /// The grace ran out and the init SIGKILLed everything.
    Kill,
    /// The host went away (stdin EOF) and the init stopped everything.
    DeadMan,
}

/// The cgroup counters the init read after the command and all stragglers were gone.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CgroupCounters {
    /// 1 or 2; `None` when no cgroup was found.
    pub version: Option<u8>,
    /// The memory high-water mark of the container's cgroup.
    pub memory_peak_bytes: Option<u64>,
    /// The memory limit the cgroup enforces.
    pub memory_limit_bytes: Option<u64>,
    /// Processes the kernel OOM-killed in the cgroup.
    pub oom_kills: Option<u64>,
    /// User + system CPU of the cgroup, in nanoseconds.
    pub cpu_usage_ns: Option<u64>,
    /// For each figure that is `None`: why.
    pub missing: BTreeMap<String, String>,
}

/// CPU and memory of the init's reaped children, from `getrusage(RUSAGE_CHILDREN)`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChildrenRusage {
    /// User CPU, µs.
    pub user_us: u64,
    /// System CPU, µs.
    pub system_us: u64,
    /// The largest RSS of one reaped descendant, KiB.
    pub max_rss_kib: u64,
}

/// Space on a filesystem, from `statvfs`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FsSpace {
    /// Size in bytes.
    pub total_bytes: u64,
    /// Free bytes.
    pub free_bytes: u64,
    /// Inodes in use: 1 is an empty filesystem (its root directory alone).
    #[serde(default)]
    pub inodes_used: Option<u64>,
}

/// What the init writes to [`RESULT_FILE`] (atomically) before it signals the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InitRecord {
    /// How the command ended.
    pub wait: WaitStatus,
    /// Who stopped it, if the init did.
    pub stopped_by: Option<StoppedBy>,
    /// How many processes were still alive after the command ended and were killed.
    pub stragglers_killed: u32,
    /// From spawning the command to its end, ms, by the init's monotonic clock.
    pub wall_time_ms: u64,
    /// The cgroup's counters.
    pub cgroup: CgroupCounters,
    /// The children's rusage.
    pub rusage: ChildrenRusage,
    /// Space on `/out` after the command.
    pub out_space: Option<FsSpace>,
    /// Whether the init's own OOM score adjustment could be kept below the command's.
    pub oom_guard: Option<String>,
}

/// Why a claim from inside the sandbox was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClaimError {
    /// the record is larger than allowed
    #[error("record larger than {0} bytes")]
    TooLarge(u64),
    /// the record cannot be read
    #[error("record unreadable")]
    Io(#[source] io::Error),
    /// the record is not valid
    #[error("record invalid: {0}")]
    Invalid(#[source] serde_json::Error),
}

/// Reads at most [`MAX_RECORD_BYTES`] from `r` and parses it strictly.
pub fn parse_claim<T: DeserializeOwned>(r: impl Read) -> Result<T, ClaimError> {
    let buf = read_capped(r, MAX_RECORD_BYTES).map_err(ClaimError::Io)?;
    if buf.len() as u64 > MAX_RECORD_BYTES {
        return Err(ClaimError::TooLarge(MAX_RECORD_BYTES));
    }
    serde_json::from_slice(&buf).map_err(ClaimError::Invalid)
}

/// Reads at most `max + 1` bytes: enough for the reader to tell "over the cap" without
/// reading an untrusted file whole.
pub fn read_capped(r: impl Read, max: u64) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    r.take(max.saturating_add(1)).read_to_end(&mut buf)?;
    Ok(buf)
}

/// Encodes the stdin frame the host sends to the init.
pub fn encode_stdin_frame(nonce: &str, spec: &InitSpec, payload: &[u8]) -> Vec<u8> {
    let json = serde_json::to_vec(spec).expect("an init spec always serialises");
    let mut out = Vec::with_capacity(json.len() + payload.len() + 64);
    out.extend_from_slice(format!("{STDIN_MAGIC} {nonce}\n{}\n", json.len()).as_bytes());
    out.extend_from_slice(&json);
    out.extend_from_slice(format!("{}\n", payload.len()).as_bytes());
    out.extend_from_slice(payload);
    out
}

/// Why the stdin frame could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// stdin failed or ended early
    #[error("stdin frame truncated")]
    Io(#[from] io::Error),
    /// the frame is malformed
    #[error("stdin frame malformed: {0}")]
    Malformed(&'static str),
    /// the spec is not valid JSON for [`InitSpec`]
    #[error("init spec invalid")]
    Spec(#[source] serde_json::Error),
}

fn read_len_line(r: &mut impl BufRead, max: usize) -> Result<usize, FrameError> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    let n: usize = line.trim_end().parse().map_err(|_| FrameError::Malformed("length line"))?;
    if n > max {
        return Err(FrameError::Malformed("length too large"));
    }
    Ok(n)
}

/// Reads the stdin frame: returns the nonce, the spec and the payload.
pub fn decode_stdin_frame(r: &mut impl BufRead) -> Result<(String, InitSpec, Vec<u8>), FrameError> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    let nonce = line
        .trim_end()
        .strip_prefix(STDIN_MAGIC)
        .and_then(|s| s.strip_prefix(' '))
        .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or(FrameError::Malformed("magic line"))?
        .to_owned();
    let n = read_len_line(r, 16 << 20)?;
    let mut json = vec![0; n];
    r.read_exact(&mut json)?;
    let spec = serde_json::from_slice(&json).map_err(FrameError::Spec)?;
    let n = read_len_line(r, crate::contract::MAX_PAYLOAD_BYTES)?;
    let mut payload = vec![0; n];
    r.read_exact(&mut payload)?;
    Ok((nonce, spec, payload))
}

/// The bytes the init writes on its stderr once the result record is in place. It starts
/// with the nonce so the host holds back nothing but a possible start of it.
pub fn done_sentinel(nonce: &str) -> String {
    format!("{nonce}:done\n")
}

/// The records the init sends right after its sentinel, so the host needs no archive call
/// for them: `<n>\n` and the init record's `n` bytes, then `<m>\n` and the handler record's
/// `m` bytes, or `-\n` when there is none. The files stay in the control area as well.
pub fn encode_trailer(init: &[u8], handler: Option<&[u8]>) -> Vec<u8> {
    let mut out = format!("{}\n", init.len()).into_bytes();
    out.extend_from_slice(init);
    match handler {
        Some(h) => {
            out.extend_from_slice(format!("{}\n", h.len()).as_bytes());
            out.extend_from_slice(h);
        }
        None => out.extend_from_slice(b"-\n"),
    }
    out
}

/// The most bytes a well-formed trailer can take.
pub const MAX_TRAILER_BYTES: usize = 2 * (MAX_RECORD_BYTES as usize + 24);

/// What the bytes after the sentinel hold so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trailer {
    /// More bytes are needed.
    Incomplete,
    /// Both records (still untrusted claims: parse them with [`parse_claim`]).
    Complete {
        /// The init record's bytes.
        init: Vec<u8>,
        /// The handler record's bytes, when the handler left one.
        handler: Option<Vec<u8>>,
    },
    /// Not a trailer stevedore's init writes: fall back to the control area.
    Invalid(String),
}

/// Decodes [`encode_trailer`]'s format from the start of `buf`.
pub fn decode_trailer(buf: &[u8]) -> Trailer {
    /// One length line: `Ok(None)` for `-`, `Err` when malformed.
    fn field(buf: &[u8]) -> Result<Option<(Option<usize>, usize)>, String> {
        let Some(nl) = buf.iter().take(24).position(|&b| b == b'\n') else {
            return if buf.len() >= 24 { Err("no length line".into()) } else { Ok(None) };
        };
        let line = std::str::from_utf8(&buf[..nl]).map_err(|_| "length is not text".to_owned())?;
        if line == "-" {
            return Ok(Some((None, nl + 1)));
        }
        let n: usize = line.parse().map_err(|_| format!("bad length {line:?}"))?;
        if n as u64 > MAX_RECORD_BYTES {
            return Err(format!("a record of {n} bytes is over the cap"));
        }
        Ok(Some((Some(n), nl + 1)))
    }
    let (init_len, at) = match field(buf) {
        Err(why) => return Trailer::Invalid(why),
        Ok(None) => return Trailer::Incomplete,
        Ok(Some((None, _))) => return Trailer::Invalid("no init record".into()),
        Ok(Some((Some(n), at))) => (n, at),
    };
    if buf.len() < at + init_len {
        return Trailer::Incomplete;
    }
    let init = buf[at..at + init_len].to_vec();
    let rest = &buf[at + init_len..];
    match field(rest) {
        Err(why) => Trailer::Invalid(why),
        Ok(None) => Trailer::Incomplete,
        Ok(Some((None, _))) => Trailer::Complete { init, handler: None },
        Ok(Some((Some(m), at))) if rest.len() >= at + m => {
            Trailer::Complete { init, handler: Some(rest[at..at + m].to_vec()) }
        }
        Ok(Some(_)) => Trailer::Incomplete,
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn trailer_round_trips_at_every_split() {
        for handler in [None, Some(&b"{\"h\":1}"[..]), Some(&b""[..])] {
            let bytes = encode_trailer(br#"{"i":2}"#, handler);
            for cut in 0..bytes.len() {
                assert_eq!(decode_trailer(&bytes[..cut]), Trailer::Incomplete, "cut at {cut}");
            }
            let want = Trailer::Complete { init: br#"{"i":2}"#.to_vec(), handler: handler.map(<[u8]>::to_vec) };
            assert_eq!(decode_trailer(&bytes), want);
        }
    }

    #[test]
    fn malformed_or_oversized_trailers_are_invalid() {
        assert!(matches!(decode_trailer(b"x\n"), Trailer::Invalid(_)));
        assert!(matches!(decode_trailer(b"-\n"), Trailer::Invalid(_)));
        assert!(matches!(decode_trailer(b"99999999999\n"), Trailer::Invalid(_)));
        assert!(matches!(decode_trailer(&[b'1'; 30]), Trailer::Invalid(_)));
        assert!(matches!(decode_trailer(b"2\n{}zz\n"), Trailer::Invalid(_)));
    }
    use super::*;

    #[test]
    fn stdin_frame_round_trip() {
        let spec = InitSpec {
            argv: vec!["sh".into(), "-c".into(), "echo hi".into()],
            env: vec![("A".into(), "1".into())],
            cwd: "/".into(),
            grace_ms: 100,
            handler_request: None,
            child_oom_score_adj: Some(500),
        };
        let bytes = encode_stdin_frame("abc123", &spec, b"pay\nload");
        let (nonce, back, payload) = decode_stdin_frame(&mut io::Cursor::new(bytes)).unwrap();
        assert_eq!(nonce, "abc123");
        assert_eq!(back, spec);
        assert_eq!(payload, b"pay\nload");
    }

    #[test]
    fn bad_frames() {
        assert!(decode_stdin_frame(&mut io::Cursor::new(b"HELLO x\n".to_vec())).is_err());
        assert!(decode_stdin_frame(&mut io::Cursor::new(b"STEVEDORE/1 zz\n2\n{}".to_vec())).is_err());
        assert!(decode_stdin_frame(&mut io::Cursor::new(b"STEVEDORE/1 ab\n5\n{}".to_vec())).is_err());
    }

    #[test]
    fn claims_are_capped_and_strict() {
        let big = vec![b' '; MAX_RECORD_BYTES as usize + 10];
        assert!(matches!(parse_claim::<HandlerRecord>(&big[..]), Err(ClaimError::TooLarge(_))));
        let extra = br#"{"result":"ok","error":"","permanent":false,"fingerprint":"x","evil":1}"#;
        assert!(matches!(parse_claim::<HandlerRecord>(&extra[..]), Err(ClaimError::Invalid(_))));
        let good = br#"{"result":"ok","error":"","permanent":false,"fingerprint":"x"}"#;
        assert_eq!(parse_claim::<HandlerRecord>(&good[..]).unwrap().result, HandlerResult::Ok);
    }
}
