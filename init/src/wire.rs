//! The link between the host and the init, and between the init and a handler runner:
//! framing, and every message the three exchange. `docs/link.md` is the prose version.
//!
//! A frame is `[kind: u8][length: u32, big-endian][body: length bytes]`. Each kind has
//! its own size cap, so a reader never buffers more than the largest frame it may get.
//!
//! Who writes what:
//! - host → init, on the container's stdin: [`Kind::Start`] once, then
//!   [`Kind::Heartbeat`], [`Kind::Stop`], [`Kind::Ack`];
//! - init → host, on the container's stdout (which only the init holds, so the command
//!   can never write into the link): [`Kind::Started`], [`Kind::Stdout`] and
//!   [`Kind::Stderr`] (the command's streams), [`Kind::Report`], [`Kind::Record`] (MACed
//!   with the attempt's key), then the outputs as [`Kind::Output`] chunks of a tar and
//!   [`Kind::OutputEnd`];
//! - handler runner ↔ init, on a socket that is the runner's stdin ([`HANDLER_FD`]):
//!   [`Kind::HandlerHello`] and [`Kind::HandlerRecord`] up, [`Kind::HandlerRequest`] and
//!   [`Kind::HandlerPayload`] down.
//!
//! Everything that comes from inside the container is an untrusted claim: readers cap it,
//! parse it strictly ([`parse_claim`]) and bound-check every figure.

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize, de::DeserializeOwned};
use sha2::Sha256;
use std::collections::BTreeMap;
use std::fmt;

/// The link's version; a [`Start`] of another version is refused.
pub const PROTOCOL: u32 = 13;
/// Bytes of a frame header.
pub const HEADER_LEN: usize = 5;
/// The largest payload a request may carry.
pub const MAX_PAYLOAD_BYTES: usize = 64 << 20;
/// The largest record (init's or handler's) accepted.
pub const MAX_RECORD_BYTES: usize = 256 << 10;
/// The longest handler error text kept.
pub const MAX_ERROR_TEXT: usize = 16 << 10;
/// The largest chunk of a stream or of the outputs tar in one frame.
pub const MAX_CHUNK: usize = 64 << 10;
/// Bytes of the record's MAC (HMAC-SHA256).
pub const MAC_LEN: usize = 32;
/// Bytes of the attempt key.
pub const KEY_LEN: usize = 32;

/// The fd on which a handler runner finds its socket to the init: its stdin (a plain
/// command's stdin is `/dev/null`). The runner moves it elsewhere first thing.
pub const HANDLER_FD: i32 = 0;

/// The fd on which the command (and everything it starts) finds its report socket to the
/// init ([`env::REPORT_FD`] says so too). Reports sent on it belong to this attempt.
pub const REPORT_FD: i32 = 3;

/// The largest report a command may send, as JSON.
pub const MAX_REPORT_BYTES: usize = 4 << 10;

/// The sandbox's non-root uid (and gid) on every rung that runs an image, unless configured
/// otherwise: not root, and no user an image is likely to define.
pub const SANDBOX_UID: u32 = 65532;
/// [`SANDBOX_UID`] as the engines' `uid:gid` (`sandbox_user_is_one_fact` ties the two).
pub const SANDBOX_USER: &str = "65532:65532";

/// Where the attempt's inputs are, read-only.
pub const IN_DIR: &str = "/in";
/// Where the attempt writes its outputs.
pub const OUT_DIR: &str = "/out";
/// Scratch space, a size-limited tmpfs.
pub const TMP_DIR: &str = "/tmp";
/// Where stevedore's tools (the init) are mounted read-only.
pub const TOOLS_DIR: &str = "/.stevedore/tools";
/// Where a parked container of the warm pool mounts its input volume writable, for the
/// engine's archive API to stage the inputs into (root's entries, no write bits): the
/// command reads them at [`IN_DIR`], the same volume mounted read-only.
pub const STAGE_DIR: &str = "/.stevedore/stage";
/// The init's file name inside [`TOOLS_DIR`].
pub const INIT_NAME: &str = "stevedore-init";

/// The argv that runs the takeover relay of link `link_id` from the tools dir, giving up
/// after `within` (what a rung's `exec` runs in the sandbox: `stevedore-init relay`).
pub fn relay_argv(link_id: &str, within: std::time::Duration) -> Vec<String> {
    vec![format!("{TOOLS_DIR}/{INIT_NAME}"), "relay".to_owned(), link_id.to_owned(), within.as_millis().to_string()]
}
/// The marker argument that makes a worker binary run one handler.
pub const HANDLER_MARKER: &str = "__stevedore_handler";

/// Environment variables stevedore sets for the command; a request cannot override them.
pub mod env {
    /// The job ID.
    pub const JOB_ID: &str = "STEVEDORE_JOB_ID";
    /// The attempt number.
    pub const ATTEMPT: &str = "STEVEDORE_ATTEMPT";
    /// The input dir inside the sandbox.
    pub const IN: &str = "STEVEDORE_IN";
    /// The output dir inside the sandbox.
    pub const OUT: &str = "STEVEDORE_OUT";
    /// For a handler runner: the fd of its socket to the init.
    pub const HANDLER_FD: &str = "STEVEDORE_HANDLER_FD";
    /// The fd of the report socket ([`super::REPORT_FD`]).
    pub const REPORT_FD: &str = "STEVEDORE_REPORT_FD";
    /// The path of stevedore's init binary inside the sandbox, whose `report` verb sends
    /// reports: `"$STEVEDORE_INIT" report progress 40`.
    pub const INIT: &str = "STEVEDORE_INIT";
    /// A parked init's read-ahead hints (`crate::warm`), in its own environment only: an
    /// argument would show them in `/proc/1/cmdline` to whatever runs in the sandbox later.
    pub const WARM: &str = "STEVEDORE_WARM";
    /// All of them.
    pub const ALL: &[&str] = &[JOB_ID, ATTEMPT, IN, OUT, HANDLER_FD, REPORT_FD, INIT, WARM];
    /// Variables the dynamic loader or glibc read at start-up. The container's process
    /// environment sets each to empty for PID 1 (an image's `ENV` cannot be removed, only
    /// overridden); the command gets the image's values back through [`super::Start::env`].
    pub const LOADER: &[&str] = &[
        "LD_PRELOAD",
        "LD_AUDIT",
        "LD_LIBRARY_PATH",
        "LD_BIND_NOW",
        "LD_DEBUG",
        "LD_DEBUG_OUTPUT",
        "LD_PROFILE",
        "LD_SHOW_AUXV",
        "LD_DYNAMIC_WEAK",
        "LD_ORIGIN_PATH",
        "GCONV_PATH",
        // From here on, what the static init's own libc reads ([`INIT_READS`]).
        "GLIBC_TUNABLES",
        "MALLOC_CHECK_",
        "MALLOC_PERTURB_",
        "MALLOC_MMAP_THRESHOLD_",
        "MALLOC_MMAP_MAX_",
        "MALLOC_TOP_PAD_",
        "MALLOC_TRIM_THRESHOLD_",
        "MALLOC_ARENA_MAX",
        "MALLOC_ARENA_TEST",
    ];
    /// Of [`LOADER`], what the static init's own libc reads when it starts (no dynamic
    /// loader runs it, and it loads no library). Where the image's values cannot be had
    /// again (the kube rung), only these are set empty for PID 1, so the command keeps the
    /// image's `LD_LIBRARY_PATH` and the like.
    pub const INIT_READS: &[&str] = LOADER.split_at(11).1;
}

/// What a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
#[non_exhaustive]
pub enum Kind {
    /// host → init: [`Start`] as JSON, then the payload (see [`encode_start`]).
    Start = 0x01,
    /// host → init: the host is alive.
    Heartbeat = 0x02,
    /// host → init: stop the command (SIGTERM, then SIGKILL after the grace).
    Stop = 0x03,
    /// host → init: the record and outputs arrived; the init may exit.
    Ack = 0x04,
    /// host → init, first on a takeover connection: the proof of the attempt key
    /// ([`takeover_proof`]), sent before the init says anything.
    Takeover = 0x05,
    /// host → init: bytes for the command's stdin: the offset of the first (`u64`), then
    /// the bytes (see [`stdin_body`]).
    Stdin = 0x06,
    /// host → init: the command's stdin ends after this many bytes (`u64`).
    StdinEnd = 0x07,
    /// host → init: the command's terminal has a new size ([`resize_body`]); only with
    /// [`Start::tty`].
    Resize = 0x08,
    /// host → init, before the Start frame: check the staging mount and the sandbox, and take
    /// the inputs that follow ([`StageSpec`] as JSON; `docs/link.md`, "Inputs over the link").
    Stage = 0x09,
    /// host → init: a chunk of the inputs tar, after [`Kind::Stage`].
    Inputs = 0x0a,
    /// host → init: the inputs tar is complete.
    InputsEnd = 0x0b,
    /// init → host: the command started ([`Started`]).
    Started = 0x10,
    /// init → host: bytes the command wrote on its stdout.
    Stdout = 0x11,
    /// init → host: bytes the command wrote on its stderr.
    Stderr = 0x12,
    /// init → host: the [`InitRecord`], MACed (see [`seal`]).
    Record = 0x13,
    /// init → host: a chunk of the outputs tar.
    Output = 0x14,
    /// init → host: the outputs tar is complete ([`OutputEnd`]).
    OutputEnd = 0x15,
    /// init → host: a report from the sandbox (a claim; never changes the status).
    Report = 0x16,
    /// init → host: a diagnostic of the init itself, as text.
    Diag = 0x17,
    /// init → host: how many bytes of its stdin the command has taken (`u64`; [`u64::MAX`]:
    /// it takes no more).
    StdinTaken = 0x18,
    /// init → host, before the Start frame and outside the numbering: what came of a
    /// [`Kind::Stage`] ([`Staged`] as JSON).
    Staged = 0x19,
    /// handler → init: the runner speaks the protocol ([`HandlerHello`]).
    HandlerHello = 0x20,
    /// init → handler: what to run ([`HandlerRequest`]).
    HandlerRequest = 0x21,
    /// init → handler: the payload bytes.
    HandlerPayload = 0x22,
    /// handler → init: how the handler ended ([`HandlerRecord`]).
    HandlerRecord = 0x23,
}

impl Kind {
    /// The kind with this byte, if any.
    pub fn from_byte(b: u8) -> Option<Kind> {
        Some(match b {
            0x01 => Kind::Start,
            0x02 => Kind::Heartbeat,
            0x03 => Kind::Stop,
            0x04 => Kind::Ack,
            0x05 => Kind::Takeover,
            0x06 => Kind::Stdin,
            0x07 => Kind::StdinEnd,
            0x08 => Kind::Resize,
            0x09 => Kind::Stage,
            0x0a => Kind::Inputs,
            0x0b => Kind::InputsEnd,
            0x10 => Kind::Started,
            0x11 => Kind::Stdout,
            0x12 => Kind::Stderr,
            0x13 => Kind::Record,
            0x14 => Kind::Output,
            0x15 => Kind::OutputEnd,
            0x16 => Kind::Report,
            0x17 => Kind::Diag,
            0x18 => Kind::StdinTaken,
            0x19 => Kind::Staged,
            0x20 => Kind::HandlerHello,
            0x21 => Kind::HandlerRequest,
            0x22 => Kind::HandlerPayload,
            0x23 => Kind::HandlerRecord,
            _ => return None,
        })
    }

    /// Whether the init sends this kind to the host: what the host's decoder accepts on the
    /// link (every other kind from the sandbox's side is an error).
    pub fn init_to_host(self) -> bool {
        matches!(
            self,
            Kind::Started
                | Kind::Stdout
                | Kind::Stderr
                | Kind::Record
                | Kind::Output
                | Kind::OutputEnd
                | Kind::Report
                | Kind::Diag
                | Kind::StdinTaken
                | Kind::Staged
        )
    }

    /// The largest body a frame of this kind may have.
    pub fn max_body(self) -> usize {
        match self {
            Kind::Start => 4 + (4 << 20) + MAX_PAYLOAD_BYTES,
            Kind::Heartbeat | Kind::StdinEnd | Kind::StdinTaken => 8,
            Kind::Resize => 4,
            Kind::Stage | Kind::Staged => 16 << 10,
            Kind::Inputs => MAX_CHUNK,
            Kind::InputsEnd => 0,
            Kind::Stdin => 8 + MAX_CHUNK,
            Kind::Stop | Kind::Ack => 0,
            Kind::Started | Kind::HandlerHello => 4 << 10,
            Kind::Stdout | Kind::Stderr | Kind::Output => MAX_CHUNK,
            Kind::Record => MAC_LEN + 2 * MAX_RECORD_BYTES,
            Kind::OutputEnd => 1 << 20,
            Kind::Takeover => TAKEOVER_LEN,
            Kind::Report => MAX_REPORT_BYTES + 256,
            Kind::Diag => 16 << 10,
            Kind::HandlerRequest => 1 << 20,
            Kind::HandlerPayload => MAX_PAYLOAD_BYTES,
            Kind::HandlerRecord => MAX_RECORD_BYTES,
        }
    }
}

/// One decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// What it is.
    pub kind: Kind,
    /// Its body.
    pub body: Vec<u8>,
}

/// Appends a frame to `out`.
///
/// # Panics
/// When `body` is larger than `kind` allows: a programming error of the writer.
pub fn encode_into(out: &mut Vec<u8>, kind: Kind, body: &[u8]) {
    assert!(body.len() <= kind.max_body(), "{kind:?} body of {} bytes is over its cap", body.len());
    out.reserve(HEADER_LEN + body.len());
    out.push(kind as u8);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(body);
}

/// One frame as bytes.
pub fn encode(kind: Kind, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(&mut out, kind, body);
    out
}

/// Why a byte stream is not a valid sequence of frames. Nothing after it can be trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FrameError {
    /// A kind byte this side does not know.
    UnknownKind(u8),
    /// A kind this side does not accept here.
    Unexpected(Kind),
    /// A body over its kind's cap.
    TooLarge {
        /// The kind.
        kind: Kind,
        /// The announced length.
        len: usize,
    },
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::UnknownKind(b) => write!(f, "unknown frame kind 0x{b:02x}"),
            FrameError::Unexpected(k) => write!(f, "unexpected frame {k:?}"),
            FrameError::TooLarge { kind, len } => write!(f, "{kind:?} frame of {len} bytes is over its cap"),
        }
    }
}

impl std::error::Error for FrameError {}

/// Decodes frames from a byte stream that arrives in arbitrary pieces.
#[derive(Debug)]
pub struct Decoder {
    buf: Vec<u8>,
    start: usize,
    accept: fn(Kind) -> bool,
    failed: Option<FrameError>,
}

impl Decoder {
    /// A decoder that accepts only the kinds for which `accept` is true.
    pub fn new(accept: fn(Kind) -> bool) -> Self {
        Self { buf: Vec::new(), start: 0, accept, failed: None }
    }

    /// Adds bytes.
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.failed.is_none() {
            if self.start > 0 && self.start == self.buf.len() {
                self.buf.clear();
                self.start = 0;
            }
            self.buf.extend_from_slice(bytes);
        }
    }

    /// The next complete frame, `Ok(None)` when more bytes are needed. After an error every
    /// call returns the same error.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let avail = &self.buf[self.start..];
        if avail.len() < HEADER_LEN {
            return Ok(None);
        }
        let fail = |me: &mut Self, e: FrameError| {
            me.failed = Some(e.clone());
            me.buf = Vec::new();
            me.start = 0;
            Err(e)
        };
        let Some(kind) = Kind::from_byte(avail[0]) else {
            return fail(self, FrameError::UnknownKind(avail[0]));
        };
        if !(self.accept)(kind) {
            return fail(self, FrameError::Unexpected(kind));
        }
        let len = u32::from_be_bytes([avail[1], avail[2], avail[3], avail[4]]) as usize;
        if len > kind.max_body() {
            return fail(self, FrameError::TooLarge { kind, len });
        }
        if avail.len() < HEADER_LEN + len {
            return Ok(None);
        }
        if avail.len() == HEADER_LEN + len && len >= 1 << 20 {
            // A large frame that is all there is (a Start with its payload): its bytes become
            // the body where they are, never copied.
            let mut body = std::mem::take(&mut self.buf);
            body.drain(..self.start + HEADER_LEN);
            self.start = 0;
            return Ok(Some(Frame { kind, body }));
        }
        let body = avail[HEADER_LEN..HEADER_LEN + len].to_vec();
        self.start += HEADER_LEN + len;
        if self.start > (1 << 20) && self.start * 2 > self.buf.len() {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        Ok(Some(Frame { kind, body }))
    }

    /// Bytes received but not yet returned as frames.
    pub fn pending(&self) -> usize {
        self.buf.len() - self.start
    }
}

/// What the host sends: everything the init needs to run the command. The payload follows
/// the JSON in the same frame ([`encode_start`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Start {
    /// [`PROTOCOL`].
    pub protocol: u32,
    /// The attempt key (hex), which MACs the record; kept only in the init's memory.
    pub key: String,
    /// The argv to run.
    pub argv: Vec<String>,
    /// The complete environment of the command (nothing of the init's is inherited).
    pub env: Vec<(String, String)>,
    /// The working directory.
    pub cwd: String,
    /// Time between SIGTERM and SIGKILL of everything, in ms.
    pub grace_ms: u64,
    /// The OOM score adjustment for the command (the init keeps its own lower).
    pub child_oom_score_adj: Option<i32>,
    /// Set for a handler attempt: the runner gets it over its socket.
    pub handler: Option<HandlerRequest>,
    /// How long a handler runner has to say hello, in ms.
    pub handshake_ms: u64,
    /// Without a frame from the host for this long, the host counts as lost (0: only EOF).
    pub heartbeat_timeout_ms: u64,
    /// How long the init keeps the command running after the host is lost (0: stop at once).
    pub host_loss_grace_ms: u64,
    /// Where the outputs are, and the caps on what is sent of them.
    pub outputs: OutputSpec,
    /// The attempt this link belongs to: a report naming any other is refused.
    pub scope: Scope,
    /// Names the init's takeover socket (the abstract unix socket
    /// `stevedore-takeover-<link_id>`, see [`takeover_socket_name`]); `None`: no takeover.
    pub link_id: Option<String>,
    /// When set, only connections from this uid may try a takeover (the process rung's
    /// worker; a container rung's relay run as a uid the command does not have).
    pub takeover_uid: Option<u32>,
    /// A listening unix socket the init inherited as this descriptor, to take over on instead
    /// of binding the abstract one (the process rung: a socket in a directory only the
    /// worker may enter).
    #[serde(default)]
    pub takeover_fd: Option<i32>,
    /// Resource limits applied to the command with `setrlimit`.
    pub rlimits: Vec<Rlimit>,
    /// The cgroup whose counters the record carries (the container's own root inside a
    /// container); `None`: none is read.
    pub cgroup_dir: Option<String>,
    /// Directories whose size the record reports once the command ended (caches).
    pub measure: Vec<String>,
    /// Sample the attempt's resources while the command runs (the record's `timeline`);
    /// `None`: no timeline.
    #[serde(default)]
    pub timeline: Option<TimelineSpec>,
    /// Where the rung mounted something: each must be a real directory at every component
    /// (no symlink), or the command is not started (`SpawnFailureKind::MountRedirected`).
    #[serde(default)]
    pub mounts: Vec<String>,
    /// The command's stdin comes from the host (`Stdin` frames); else it is `/dev/null`
    /// (or, with `tty`, a terminal nothing is typed into).
    #[serde(default)]
    pub stdin: bool,
    /// The command gets a terminal of this size for its stdin, stdout and stderr (one
    /// stream: what it writes comes as `Stdout`), its controlling terminal; `Resize` frames
    /// change the size. `None`: pipes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tty: Option<TermSize>,
    /// The image's environment is the runtime's, which the host cannot read (the kube rung:
    /// Kubernetes gives an image's `ENV` and `WORKDIR` to PID 1, and the API shows neither):
    /// `Some(keys)` makes the init's own environment at its start, without these keys (what
    /// the rung set for PID 1 alone), the lowest layer under `env`, and an empty `cwd` the
    /// init's own. `None`: `env` is the whole environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_env: Option<Vec<String>>,
    /// The init runs as root (to write the inputs it was sent, [`Kind::Stage`]) and drops to
    /// these before anything of the command runs; `None`: the command runs as the init does
    /// (the engine set the user, or a profile allows root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<Credentials>,
    /// Limits the policy demands be enforced (`Policy::require_enforced`), as the rung applied
    /// them: the init reads each back from [`Start::cgroup_dir`] before it starts anything,
    /// and one the cgroup does not hold (or no cgroup to read) means the command is not
    /// started (`SpawnFailureKind::NotEnforced`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<Held>,
}

/// A cgroup limit the init must find held before the command starts ([`Start::held`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Held {
    /// Which limit.
    pub limit: HeldLimit,
    /// The most the cgroup may allow: bytes of memory, processes, or thousandths of a CPU.
    pub at_most: u64,
}

/// The cgroup limits the init can read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HeldLimit {
    /// `memory.max` (v1 `memory.limit_in_bytes`), bytes.
    Memory,
    /// `pids.max`, processes.
    Pids,
    /// `cpu.max` (v1 `cpu.cfs_quota_us` over `cpu.cfs_period_us`), thousandths of a CPU.
    Cpu,
}

impl HeldLimit {
    /// The name `Policy::require_enforced` and the evidence use.
    pub fn name(self) -> &'static str {
        match self {
            HeldLimit::Memory => "memory",
            HeldLimit::Pids => "pids",
            HeldLimit::Cpu => "cpu",
        }
    }
}

/// Who the command runs as, for a root init to become (`privileges`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Credentials {
    /// The uid (real, effective and saved).
    pub uid: u32,
    /// The gid (likewise).
    pub gid: u32,
    /// The supplementary groups: the rung's own list, never the image's files.
    pub groups: Vec<u32>,
}

/// What the kernel says of the init's credentials after it dropped them
/// (`/proc/self/status`'s fields, as written there), and whether it is dumpable.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CredentialsSeen {
    /// `Uid:` (real, effective, saved, filesystem).
    pub uid: String,
    /// `Gid:`.
    pub gid: String,
    /// `Groups:`.
    pub groups: String,
    /// `CapInh:`.
    pub cap_inh: String,
    /// `CapPrm:`.
    pub cap_prm: String,
    /// `CapEff:`.
    pub cap_eff: String,
    /// `CapBnd:`.
    pub cap_bnd: String,
    /// `CapAmb:`.
    pub cap_amb: String,
    /// `NoNewPrivs:`.
    pub no_new_privs: String,
    /// `Seccomp:`.
    pub seccomp: String,
    /// Whether the process is dumpable (its memory and descriptors open to its own uid).
    pub dumpable: bool,
}

/// What the host asks of a root init before the Start frame ([`Kind::Stage`]): that it is
/// alone in the sandbox and the staging mount is fit, then (when `inputs` is set) that it
/// writes the inputs tar that follows into it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageSpec {
    /// The staging mount (writable): the inputs volume, its root owned by uid 0, no group
    /// or other write bit, empty.
    pub stage_dir: String,
    /// The staging mount's root may carry group and other write bits as the runtime made it
    /// (a Kubernetes `emptyDir` is 0777): the init, its owner, clears them by the mount's own
    /// descriptor before it checks that the mount is empty, so nothing written by another uid
    /// before that can be there unseen. `false`: such bits are a refusal.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tighten: bool,
    /// The same volume mounted read-only, where the command reads the inputs: the staging
    /// mount must be on its device.
    pub in_dir: String,
    /// What the tar that follows holds, as the host wrote it; `None`: no inputs (only the
    /// checks, a parked container claimed).
    pub inputs: Option<InputsSent>,
}

/// The bounds of the inputs the host sends: past them the init stops and refuses. The host
/// compares the init's answer (counts and tree digest) with what it wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputsSent {
    /// Entries (files, directories, symlinks) at most.
    pub max_entries: u64,
    /// Bytes of file content at most.
    pub max_bytes: u64,
}

/// What came of a [`Kind::Stage`]: the checks passed and the inputs were written (their
/// counts and tree digest, `docs/outcome.md` "Input tree digest"), or why not.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Staged {
    /// Why the init refused (another process in the sandbox, the staging mount not fit, an
    /// entry it would not write, counts that are not the host's); `None`: done.
    pub refused: Option<String>,
    /// Entries written.
    pub entries: u64,
    /// Regular files written.
    pub files: u64,
    /// Bytes of file content written.
    pub bytes: u64,
    /// The tree digest of what was written (`sha256:<hex>`).
    pub tree: Option<String>,
}

impl Start {
    /// Puts the image's environment (`own`: PID 1's, as the runtime gave it) under `env`,
    /// and the init's working directory (`own_cwd`) in place of an empty `cwd`, when
    /// [`Start::image_env`] asks for it; the protocol's own variables never come from below.
    pub fn take_image_env(&mut self, own: impl IntoIterator<Item = (String, String)>, own_cwd: Option<String>) {
        let Some(except) = self.image_env.take() else { return };
        let mut merged: BTreeMap<String, String> =
            own.into_iter().filter(|(k, _)| !except.contains(k) && !env::ALL.contains(&k.as_str())).collect();
        merged.extend(std::mem::take(&mut self.env));
        self.env = merged.into_iter().collect();
        if self.cwd.is_empty() {
            self.cwd = own_cwd.filter(|c| c.starts_with('/')).unwrap_or_else(|| "/".into());
        }
    }
}

/// A terminal's size in character cells.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TermSize {
    /// Rows.
    pub rows: u16,
    /// Columns.
    pub cols: u16,
}

/// The attempt a link belongs to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scope {
    /// The job ID.
    pub job_id: String,
    /// The attempt number.
    pub attempt: u32,
}

/// A `setrlimit` resource the init may set on the command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RlimitResource {
    /// Open files per process (`RLIMIT_NOFILE`).
    Nofile,
    /// Processes of the command's uid in all, every attempt of that uid counted
    /// (`RLIMIT_NPROC`).
    Nproc,
    /// The largest core dump (`RLIMIT_CORE`).
    Core,
    /// CPU seconds per process (`RLIMIT_CPU`): total time, not a rate.
    Cpu,
    /// The largest file a process may write (`RLIMIT_FSIZE`).
    Fsize,
}

/// One resource limit for the command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rlimit {
    /// Which.
    pub resource: RlimitResource,
    /// The soft limit.
    pub soft: u64,
    /// The hard limit.
    pub hard: u64,
}

/// The abstract unix socket name (without the leading NUL) of a link's takeover socket.
pub fn takeover_socket_name(link_id: &str) -> String {
    format!("stevedore-takeover-{link_id}")
}

/// Whether `id` is a valid link ID: 32 lowercase hex digits.
pub fn valid_link_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// How the init begins the `Diag` it sends on a takeover connection it refuses (a wrong or
/// used proof): the host then stops trying.
pub const TAKEOVER_REFUSED: &str = "takeover refused: ";

/// The bytes of a takeover's nonce.
pub const NONCE_LEN: usize = 32;
/// A [`Kind::Takeover`] body: the host's nonce, how many of the init's frames the host
/// already has (`u64`, big-endian; 0 from a host that starts afresh), the MAC of both.
pub const TAKEOVER_LEN: usize = NONCE_LEN + 8 + MAC_LEN;

fn takeover_mac(key: &[u8; KEY_LEN], link_id: &str, nonce: &[u8], resume: u64) -> HmacSha256 {
    let mut mac = HmacSha256::new_from_slice(key).expect("any key length works");
    mac.update(b"stevedore-takeover-4\0");
    mac.update(link_id.as_bytes());
    mac.update(b"\0");
    mac.update(nonce);
    mac.update(&resume.to_be_bytes());
    mac
}

/// The body of a [`Kind::Takeover`] frame: proves the attempt key for `link_id`, with a
/// fresh `nonce` of the host's, and says how many of the init's frames the host has.
///
/// The host speaks first, in one write: no challenge has to travel to the host and back,
/// so nothing in the sandbox can hold a connection slot while the real host's answer is
/// on its way (see `docs/link.md`, "Taking over an attempt").
pub fn takeover_proof(key: &[u8; KEY_LEN], link_id: &str, nonce: &[u8; NONCE_LEN], resume: u64) -> Vec<u8> {
    let mac = takeover_mac(key, link_id, nonce, resume).finalize().into_bytes();
    let mut body = Vec::with_capacity(TAKEOVER_LEN);
    body.extend_from_slice(nonce);
    body.extend_from_slice(&resume.to_be_bytes());
    body.extend_from_slice(&mac);
    body
}

/// Checks a [`Kind::Takeover`] body in constant time; the nonce and the frames the host has.
pub fn takeover_open(key: &[u8; KEY_LEN], link_id: &str, body: &[u8]) -> Option<([u8; NONCE_LEN], u64)> {
    if body.len() != TAKEOVER_LEN {
        return None;
    }
    let nonce: [u8; NONCE_LEN] = body[..NONCE_LEN].try_into().ok()?;
    let resume = u64::from_be_bytes(body[NONCE_LEN..NONCE_LEN + 8].try_into().ok()?);
    takeover_mac(key, link_id, &nonce, resume).verify_slice(&body[NONCE_LEN + 8..]).ok()?;
    Some((nonce, resume))
}

/// Which outputs the init sends back, and how many.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputSpec {
    /// The output dir.
    pub dir: String,
    /// The most regular files sent.
    pub max_files: u64,
    /// The most bytes of file content sent. The init lowers it to what the output dir's
    /// filesystem can hold: a file larger than that must be sparse, and is refused from its
    /// size before a byte of it is read.
    pub max_bytes: u64,
    /// Sending the outputs takes at most this long, plus a second per
    /// [`OutputSpec::collect_bytes_per_s`] bytes the dir holds ([`OutputSpec::deadline`]);
    /// 0: no deadline. A file that cannot go within what is left is refused
    /// (`collection_deadline`), and so is every file after the deadline.
    #[serde(default)]
    pub collect_min_ms: u64,
    /// See [`OutputSpec::collect_min_ms`].
    #[serde(default)]
    pub collect_bytes_per_s: u64,
    /// The host walks the output dir itself where it holds it (the oci rung's tmpfs, which
    /// it mounted): the init sends no tar, and its [`OutputEnd`] only says it sent nothing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub host_walks: bool,
}

impl OutputSpec {
    /// The outputs of `dir` within these caps, with no deadline, sent by the init.
    pub fn new(dir: impl Into<String>, max_files: u64, max_bytes: u64) -> Self {
        Self { dir: dir.into(), max_files, max_bytes, collect_min_ms: 0, collect_bytes_per_s: 0, host_walks: false }
    }

    /// How long sending `held` bytes may take (what the output dir's filesystem holds, at most
    /// the byte budget); `None`: no limit. The host works the same figure out from the
    /// record's `out_fs`, to know when to stop waiting.
    pub fn deadline(&self, held: u64) -> Option<std::time::Duration> {
        (self.collect_min_ms > 0).then(|| {
            let extra_ms = held.saturating_mul(1000) / self.collect_bytes_per_s.max(1);
            std::time::Duration::from_millis(self.collect_min_ms.saturating_add(extra_ms))
        })
    }
}

/// The Start frame's body: the JSON's length, the JSON, the payload.
pub fn encode_start(start: &Start, payload: &[u8]) -> Vec<u8> {
    let mut frame = start_head(start, payload.len());
    frame.extend_from_slice(payload);
    frame
}

/// A Start frame up to its payload (header, JSON length, JSON) for a payload of `payload_len`
/// bytes that follows it: so a large payload is written from where it is, never copied into
/// a frame.
pub fn start_head(start: &Start, payload_len: usize) -> Vec<u8> {
    let json = serde_json::to_vec(start).expect("a start always serialises");
    let body_len = 4 + json.len() + payload_len;
    assert!(body_len <= Kind::Start.max_body(), "Start body of {body_len} bytes is over its cap");
    let mut head = Vec::with_capacity(HEADER_LEN + 4 + json.len());
    head.push(Kind::Start as u8);
    head.extend_from_slice(&(body_len as u32).to_be_bytes());
    head.extend_from_slice(&(json.len() as u32).to_be_bytes());
    head.extend_from_slice(&json);
    head
}

/// [`decode_start`] of a body it may keep: the payload is the body's own bytes after the
/// start, never a copy.
pub fn decode_start_owned(mut body: Vec<u8>) -> Result<(Start, Vec<u8>), String> {
    let start = start_of(&body)?;
    let n = u32::from_be_bytes([body[0], body[1], body[2], body[3]]) as usize;
    body.drain(..4 + n);
    if body.len() > MAX_PAYLOAD_BYTES {
        return Err("payload over its cap".into());
    }
    Ok((start, body))
}

/// The start of a Start frame's body, checked.
fn start_of(body: &[u8]) -> Result<Start, String> {
    if body.len() < 4 {
        return Err("start frame too short".into());
    }
    let n = u32::from_be_bytes([body[0], body[1], body[2], body[3]]) as usize;
    let json = body.get(4..4 + n).ok_or("start frame truncated")?;
    let start: Start = serde_json::from_slice(json).map_err(|e| format!("start invalid: {e}"))?;
    if start.protocol != PROTOCOL {
        return Err(format!("protocol {} is not this init's {PROTOCOL}", start.protocol));
    }
    Ok(start)
}

/// Splits a Start frame's body into the start and the payload.
pub fn decode_start(body: &[u8]) -> Result<(Start, Vec<u8>), String> {
    let start = start_of(body)?;
    let n = u32::from_be_bytes([body[0], body[1], body[2], body[3]]) as usize;
    let payload = body[4 + n..].to_vec();
    if payload.len() > MAX_PAYLOAD_BYTES {
        return Err("payload over its cap".into());
    }
    Ok((start, payload))
}

/// What a handler runner gets.
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
    pub prior_outputs: Vec<PriorOutput>,
    /// Milliseconds the handler has from its start, if there is a deadline.
    pub deadline_ms: Option<u64>,
}

/// The output of an earlier step, passed to the handler untouched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriorOutput {
    /// Its name.
    pub name: String,
    /// The opaque artifact reference.
    pub reference: String,
}

/// The runner's first words: it speaks the protocol, with this handler set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HandlerHello {
    /// [`PROTOCOL`].
    pub protocol: u32,
    /// The fingerprint of the runner's handler set.
    pub fingerprint: String,
}

/// How the handler ended, as its runner says.
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
    /// Why it could not start, when `result` is `launch_failed`.
    #[serde(default)]
    pub launch: Option<LaunchFailure>,
}

/// The runner's verdict on its handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HandlerResult {
    /// The handler returned `Ok`.
    Ok,
    /// The handler returned an error.
    Error,
    /// The handler panicked.
    Panicked,
    /// The handler could not be started.
    LaunchFailed,
}

/// Why a handler could not start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LaunchFailure {
    /// The handler is not in the runner's set.
    UnknownHandler,
    /// The runner's handler set is not the one the caller expects.
    FingerprintMismatch,
    /// The request or payload could not be read or is invalid.
    BadRequest,
}

/// How the command ended, as the init saw it through `waitpid`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum WaitStatus {
    /// It exited with this code.
    Code(i32),
    /// A signal killed it.
    Signal(i32),
    /// It could not be started.
    SpawnFailed(SpawnFailure),
}

/// Why the command could not be started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpawnFailure {
    /// `not_found`, `not_executable` or `other`.
    pub kind: SpawnFailureKind,
    /// The error text.
    pub message: String,
}

/// The class of a spawn failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpawnFailureKind {
    /// The program does not exist.
    NotFound,
    /// It exists but cannot be executed.
    NotExecutable,
    /// A mount destination has a symlink in one of its components: the engine followed it
    /// and put a mount elsewhere than where stevedore asked.
    MountRedirected,
    /// A limit the policy demands is not what the sandbox's cgroup holds ([`Start::held`]).
    NotEnforced,
    /// Anything else.
    Other,
}

/// Who stopped the command, if the init did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoppedBy {
    /// The host asked (a Stop frame, or SIGTERM through the engine) and the command ended
    /// within the grace.
    Term,
    /// The grace ran out and the init SIGKILLed everything.
    Kill,
    /// The host was lost and the init stopped everything.
    DeadMan,
    /// A handler runner did not speak the protocol in time.
    Handshake,
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
    /// The process limit the cgroup enforces (`pids.max`).
    pub pids_limit: Option<u64>,
    /// The CPU limit the cgroup enforces, thousandths of a CPU (its CFS quota over period).
    pub cpu_limit_millis: Option<u64>,
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

/// Space on the output filesystem after the command, from `statvfs`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FsSpace {
    /// Size in bytes.
    pub total_bytes: u64,
    /// Free bytes for a non-root user.
    pub free_bytes: u64,
}

/// Everything the init saw in the output dir, sent or not.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutScan {
    /// Regular files.
    pub files: u64,
    /// Their apparent size (`st_size`), which a sparse file can make huge.
    pub apparent_bytes: u64,
    /// What they hold: per file the smaller of its size and its allocated blocks, so a
    /// sparse file counts what was written, not what it claims.
    pub written_bytes: u64,
    /// The walk stopped at one of its own bounds (entries, depth) before the end.
    pub truncated: bool,
}

/// What the handler runner said over its socket, as the init received it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HandlerChannel {
    /// Its hello, if it said one.
    pub hello: Option<HandlerHello>,
    /// Its record, if it left one.
    pub record: Option<HandlerRecord>,
    /// What the init refused on the channel (malformed or unexpected frames), with why.
    pub refused: Vec<String>,
}

/// The init's account of the attempt, sent once the command and every straggler are gone.
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
    /// Space on the output filesystem after the command.
    pub out_fs: Option<FsSpace>,
    /// Whether the init's own OOM score adjustment could be kept below the command's.
    pub oom_guard: Option<String>,
    /// For a handler attempt: what its runner said.
    pub handler: Option<HandlerChannel>,
    /// Bytes of the command's stdout and stderr the init forwarded.
    pub stdout_bytes: u64,
    /// See `stdout_bytes`.
    pub stderr_bytes: u64,
    /// Whether the host was lost at some point.
    pub host_lost: bool,
    /// Takeovers of the link by a host that proved the key.
    pub takeovers: u32,
    /// What became of the command's reports.
    pub reports: ReportCounts,
    /// The directories [`Start::measure`] named, as found after the command.
    pub measured: Vec<Measured>,
    /// The samples [`Start::timeline`] asked for.
    #[serde(default)]
    pub timeline: Option<Timeline>,
    /// Bytes the init held in its cgroup from before the command started until every
    /// process of the attempt was gone (`stevedore-init --reserve`), then let go, so that
    /// sending the outputs finds memory in a cgroup the command filled (0: none was asked,
    /// or it could not be had). The cgroup's figures above include it.
    #[serde(default)]
    pub reserve_bytes: u64,
    /// Where the init started as root ([`Start::credentials`]): what the kernel said of it
    /// after it dropped them, before the command's fork.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<CredentialsSeen>,
    /// The kernel the sandbox saw: the first line of its `/proc/version` (at most
    /// [`MAX_KERNEL_LINE`] bytes). The host compares it with its own to show a `vm` level.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    /// The file the command's program resolved to in the sandbox (along its `PATH`, links
    /// followed; at most [`crate::warm::MAX_HINT_LEN`] bytes), read as the command started:
    /// what a warm pool reads ahead for the next attempts on the image (`crate::warm`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub program: Option<String>,
    /// The program's name as the command gave it, where it has no slash (looked up along
    /// `PATH`), at most [`crate::warm::MAX_HINT_LEN`] bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub program_name: Option<String>,
    /// What the init read ahead while it was parked (`crate::warm`), where it was asked to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_ahead: Option<crate::warm::ReadAhead>,
}

/// The most of `/proc/version`'s line the record carries.
pub const MAX_KERNEL_LINE: usize = 256;

/// The release in a `/proc/version` line (`Linux version 6.1.0-18-amd64 (…) …` →
/// `6.1.0-18-amd64`), or the line itself when it is not in that form.
pub fn kernel_release(line: &str) -> &str {
    line.strip_prefix("Linux version ").and_then(|r| r.split_whitespace().next()).unwrap_or(line.trim())
}

/// What to sample while the command runs, and how often.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimelineSpec {
    /// The first period between samples, ms (at least [`MIN_SAMPLE_PERIOD_MS`]).
    pub period_ms: u64,
    /// The most samples kept (at most [`MAX_TIMELINE_SAMPLES`]); at that many, every second
    /// one is dropped and the period doubles.
    pub max_samples: u32,
    /// The cgroup to read (its version found there); `None`: [`Start::cgroup_dir`].
    pub cgroup: Option<SampledCgroup>,
    /// The output dir and the scratch dir: their bytes in use are sampled when each is a
    /// filesystem of its own (a tmpfs), else the record says why not.
    pub out_dir: Option<String>,
    /// See `out_dir`.
    pub tmp_dir: Option<String>,
}

/// The shortest period the init samples at.
pub const MIN_SAMPLE_PERIOD_MS: u64 = 10;
/// The most samples a timeline keeps.
pub const MAX_TIMELINE_SAMPLES: u32 = 1024;

/// A cgroup the init samples that is not at one root (the process rung's, made on the host).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum SampledCgroup {
    /// A v2 cgroup's directory.
    V2(String),
    /// A v1 cgroup made under each controller's hierarchy.
    V1 {
        /// Under `memory`.
        memory: Option<String>,
        /// Under `cpuacct`.
        cpuacct: Option<String>,
        /// Under `pids`.
        pids: Option<String>,
    },
}

/// The thinning rule of a timeline, the init's and the host's: every second entry of each
/// column dropped, the first kept.
pub fn thin_columns<const N: usize>(columns: [&mut Vec<u64>; N]) {
    for col in columns {
        let mut keep = false;
        col.retain(|_| {
            keep = !keep;
            keep
        });
    }
}

/// What the init sampled: columns of equal length, one entry per sample (an empty column:
/// `missing` says why).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Timeline {
    /// The period sampling started at, ms.
    pub first_period_ms: u64,
    /// The period at the end, ms.
    pub period_ms: u64,
    /// Since the command started, ms.
    pub t_ms: Vec<u64>,
    /// Memory in use by the cgroup, bytes.
    pub memory_bytes: Vec<u64>,
    /// CPU the cgroup used so far, ms.
    pub cpu_ms: Vec<u64>,
    /// Tasks in the cgroup.
    pub pids: Vec<u64>,
    /// Bytes in use in the output dir.
    pub out_bytes: Vec<u64>,
    /// Bytes in use in the scratch dir.
    pub tmp_bytes: Vec<u64>,
    /// The first sample's time at which the cgroup's OOM kill count had risen.
    pub oom_kill_ms: Option<u64>,
    /// Each empty column: why.
    pub missing: BTreeMap<String, String>,
}

/// The size of a directory, by a walk that follows nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Measured {
    /// The directory.
    pub path: String,
    /// What was found in it.
    pub seen: OutScan,
}

/// What the init did with the reports the command sent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportCounts {
    /// Forwarded to the host.
    pub forwarded: u64,
    /// Dropped by the rate limit (a burst, then a steady rate).
    pub dropped_rate: u64,
    /// Dropped because the attempt's total was reached, or the socket was closed for a
    /// flood of bytes.
    pub dropped_total: u64,
    /// Refused: malformed, too large, or naming another attempt.
    pub refused: u64,
    /// Why the first few were refused.
    pub refusals: Vec<String>,
}

/// What the init says when the command started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Started {
    /// The command's pid inside the container.
    pub pid: i32,
    /// The init's version.
    pub init_version: String,
    /// Sent again on a takeover: the new host continues the attempt from here.
    #[serde(default)]
    pub resumed: bool,
    /// On a takeover: whether the command had already ended.
    #[serde(default)]
    pub ended: bool,
    /// On a takeover: the number of the first frame the new host is sent after this one
    /// (frames are numbered from 0 on the attempt's link; this `Started` is outside the
    /// numbering). Below the count the host gave: what it has is sent again; above it: the
    /// frames between were lost.
    #[serde(default)]
    pub from: u64,
    /// The kernel the sandbox sees (as [`InitRecord::kernel`]), said as the command starts so
    /// that an attempt whose record never comes still shows where it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
}

/// A `Stdin` frame's body: `data`, the command's stdin from byte `offset` on.
pub fn stdin_body(offset: u64, data: &[u8]) -> Vec<u8> {
    [&offset.to_be_bytes()[..], data].concat()
}

/// A `Resize` frame's body: rows then columns, each a big-endian `u16`.
pub fn resize_body(size: TermSize) -> [u8; 4] {
    let (r, c) = (size.rows.to_be_bytes(), size.cols.to_be_bytes());
    [r[0], r[1], c[0], c[1]]
}

/// A `Resize` frame's size (`None`: not 4 bytes).
pub fn resize_of(body: &[u8]) -> Option<TermSize> {
    let b: [u8; 4] = body.try_into().ok()?;
    Some(TermSize { rows: u16::from_be_bytes([b[0], b[1]]), cols: u16::from_be_bytes([b[2], b[3]]) })
}

/// A `Stdin` frame's offset and bytes (`None`: too short to be one).
pub fn stdin_parts(body: &[u8]) -> Option<(u64, &[u8])> {
    let (offset, data) = body.split_first_chunk::<8>()?;
    Some((u64::from_be_bytes(*offset), data))
}

/// A heartbeat's body: how many of the init's frames the host has received.
pub fn heartbeat_body(count: u64) -> [u8; 8] {
    count.to_be_bytes()
}

/// The count a heartbeat carries (an empty one counts nothing).
pub fn heartbeat_count(body: &[u8]) -> u64 {
    body.try_into().map_or(0, u64::from_be_bytes)
}

/// One output entry that was not sent, with why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Refused {
    /// Its path relative to the output dir, escaped when not UTF-8.
    pub name: String,
    /// `symlink`, `fifo`, `socket`, `device`, `non_utf8_name`, `over_cap`, `unreadable: ...`.
    pub why: String,
}

/// The end of the outputs tar.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputEnd {
    /// Regular files sent.
    pub files: u64,
    /// Bytes of their content.
    pub bytes: u64,
    /// Entries not sent (at most a bounded number are named).
    pub refused: Vec<Refused>,
    /// Some files were left out for the caps.
    pub over_cap: bool,
    /// Why the tar could not be completed, if it could not.
    pub error: Option<String>,
    /// Everything seen in the output dir, sent or not.
    pub seen: OutScan,
    /// The byte budget the init applied (the caps', or less: what the filesystem holds).
    #[serde(default)]
    pub budget_bytes: u64,
    /// The collection's deadline, ms, when it had one; and whether it ran out.
    #[serde(default)]
    pub deadline_ms: Option<u64>,
    /// Files were left out because the deadline ran out.
    #[serde(default)]
    pub deadline_hit: bool,
}

type HmacSha256 = Hmac<Sha256>;

/// Decodes a hex key of [`KEY_LEN`] bytes.
pub fn parse_key(hex: &str) -> Option<[u8; KEY_LEN]> {
    // Hex digits only: `from_str_radix` alone also takes a sign ("+f" is 15).
    if hex.len() != KEY_LEN * 2 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut key = [0u8; KEY_LEN];
    for (i, k) in key.iter_mut().enumerate() {
        *k = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(key)
}

/// The Record frame's body: the MAC of `json` under `key`, then `json`.
pub fn seal(key: &[u8; KEY_LEN], json: &[u8]) -> Vec<u8> {
    let mut mac = HmacSha256::new_from_slice(key).expect("any key length works");
    mac.update(json);
    let mut body = mac.finalize().into_bytes().to_vec();
    body.extend_from_slice(json);
    body
}

/// Checks a Record frame's body and returns its JSON.
pub fn open_sealed<'a>(key: &[u8; KEY_LEN], body: &'a [u8]) -> Result<&'a [u8], ClaimError> {
    if body.len() < MAC_LEN {
        return Err(ClaimError::BadMac);
    }
    let (tag, json) = body.split_at(MAC_LEN);
    let mut mac = HmacSha256::new_from_slice(key).expect("any key length works");
    mac.update(json);
    mac.verify_slice(tag).map_err(|_| ClaimError::BadMac)?;
    Ok(json)
}

/// Why a claim from inside the sandbox was refused.
#[derive(Debug)]
#[non_exhaustive]
pub enum ClaimError {
    /// the record is larger than allowed
    TooLarge(usize),
    /// the record's MAC does not verify
    BadMac,
    /// the record is not valid
    Invalid(serde_json::Error),
}

impl fmt::Display for ClaimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClaimError::TooLarge(n) => write!(f, "record larger than {n} bytes"),
            ClaimError::BadMac => f.write_str("record MAC does not verify"),
            ClaimError::Invalid(e) => write!(f, "record invalid: {e}"),
        }
    }
}

impl std::error::Error for ClaimError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ClaimError::Invalid(e) => Some(e),
            _ => None,
        }
    }
}

/// Parses a claim strictly, refusing one over `max` bytes.
pub fn parse_claim<T: DeserializeOwned>(bytes: &[u8], max: usize) -> Result<T, ClaimError> {
    if bytes.len() > max {
        return Err(ClaimError::TooLarge(max));
    }
    serde_json::from_slice(bytes).map_err(ClaimError::Invalid)
}

/// Cuts `s` to at most `max` bytes on a character boundary.
pub fn cap_text(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

/// `text` as one line a terminal shows as it is: every control character (newlines and tabs
/// included), every format character (Unicode's `Cf`: the bidirectional controls, zero-width
/// spaces and joiners, U+FEFF) and every line or paragraph separator (U+2028, U+2029) escaped
/// (`\n`, `\r`, `\t`, else `\u{..}`). Text from a sandbox (an image's names, a handler's error,
/// an output's name) goes through it before stevedore prints it as a line of its own, so it
/// can neither move the cursor, retitle a window, reorder or hide what is shown, nor begin a
/// line that looks like stevedore's.
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() || unseen(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// A character that is not shown as itself: a format character, or a line or paragraph
/// separator (by the Unicode tables, so that none is missed).
fn unseen(c: char) -> bool {
    use unicode_properties::{GeneralCategory, UnicodeGeneralCategory};
    matches!(
        c.general_category(),
        GeneralCategory::Format | GeneralCategory::LineSeparator | GeneralCategory::ParagraphSeparator
    )
}

/// A path relative to the output dir as text: UTF-8 as is, other bytes as `\xNN`.
pub fn escape_name(name: &[u8]) -> String {
    let mut out = String::with_capacity(name.len());
    for chunk in name.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c == '\\' {
                out.push_str("\\\\");
            } else if c.is_control() {
                out.extend(c.escape_default());
            } else {
                out.push(c);
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start() -> Start {
        Start {
            protocol: PROTOCOL,
            key: "00".repeat(KEY_LEN),
            argv: vec!["sh".into(), "-c".into(), "echo hi".into()],
            env: vec![("A".into(), "1".into())],
            cwd: "/".into(),
            grace_ms: 100,
            child_oom_score_adj: Some(500),
            handler: None,
            handshake_ms: 1000,
            heartbeat_timeout_ms: 0,
            host_loss_grace_ms: 0,
            outputs: OutputSpec {
                dir: "/out".into(),
                max_files: 10,
                max_bytes: 100,
                collect_min_ms: 0,
                collect_bytes_per_s: 0,
                host_walks: false,
            },
            scope: Scope { job_id: "j".into(), attempt: 1 },
            link_id: Some("0".repeat(32)),
            takeover_uid: None,
            takeover_fd: None,
            mounts: Vec::new(),
            stdin: false,
            tty: None,
            image_env: None,
            credentials: None,
            held: Vec::new(),
            rlimits: vec![Rlimit { resource: RlimitResource::Nofile, soft: 64, hard: 64 }],
            cgroup_dir: None,
            measure: Vec::new(),
            timeline: None,
        }
    }

    #[test]
    fn sandbox_user_is_one_fact() {
        assert_eq!(SANDBOX_USER, format!("{SANDBOX_UID}:{SANDBOX_UID}"));
    }

    #[test]
    fn what_the_init_reads_is_glibcs_tunables_and_mallocs_and_nothing_of_the_loader() {
        assert_eq!(env::INIT_READS[0], "GLIBC_TUNABLES");
        assert!(env::INIT_READS[1..].iter().all(|k| k.starts_with("MALLOC_")), "{:?}", env::INIT_READS);
        assert_eq!(env::INIT_READS.len(), 9);
    }

    #[test]
    fn the_image_env_is_the_lowest_layer_and_never_gives_the_protocols_variables() {
        let own =
            |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect::<Vec<_>>();
        let mut s = start();
        s.cwd = String::new();
        s.env = vec![("A".into(), "request".into()), (env::OUT.into(), "/out".into())];
        s.image_env = Some(vec!["LD_PRELOAD".into()]);
        let image = own(&[("A", "image"), ("B", "image"), ("LD_PRELOAD", ""), (env::IN, "/evil"), ("PATH", "/x")]);
        s.take_image_env(image, Some("/work".into()));
        let got: BTreeMap<String, String> = s.env.iter().cloned().collect();
        assert_eq!(got["A"], "request", "what the host gives wins");
        assert_eq!(got["B"], "image");
        assert_eq!(got["PATH"], "/x");
        assert!(!got.contains_key("LD_PRELOAD"), "what the rung set for PID 1 alone stays there");
        assert!(!got.contains_key(env::IN), "a protocol variable never comes from the image");
        assert_eq!(s.cwd, "/work");
        assert!(s.image_env.is_none());
        // Without the ask nothing changes; a relative cwd from below is not taken.
        let mut plain = start();
        plain.take_image_env(own(&[("B", "image")]), Some("/work".into()));
        assert_eq!(plain.env, start().env);
        let mut rel = start();
        rel.cwd = String::new();
        rel.image_env = Some(Vec::new());
        rel.take_image_env(Vec::new(), Some("work".into()));
        assert_eq!(rel.cwd, "/");
    }

    #[test]
    fn frames_round_trip_at_every_split() {
        let mut bytes = encode_start(&start(), b"pay\nload");
        encode_into(&mut bytes, Kind::Heartbeat, b"");
        encode_into(&mut bytes, Kind::Stop, b"");
        for cut in 0..=bytes.len() {
            let mut d = Decoder::new(|k| matches!(k, Kind::Start | Kind::Heartbeat | Kind::Stop));
            let mut got = Vec::new();
            for piece in [&bytes[..cut], &bytes[cut..]] {
                d.feed(piece);
                while let Some(f) = d.next_frame().unwrap() {
                    got.push(f);
                }
            }
            assert_eq!(got.len(), 3, "cut {cut}");
            let (s, payload) = decode_start(&got[0].body).unwrap();
            assert_eq!((s, payload.as_slice()), (start(), &b"pay\nload"[..]));
            assert_eq!(got[1].kind, Kind::Heartbeat);
            assert_eq!(d.pending(), 0);
        }
    }

    #[test]
    fn bad_streams_fail_for_good() {
        let mut d = Decoder::new(|k| k == Kind::Stdout);
        d.feed(&[0x7f, 0, 0, 0, 0]);
        assert_eq!(d.next_frame(), Err(FrameError::UnknownKind(0x7f)));
        d.feed(&encode(Kind::Stdout, b"x"));
        assert!(d.next_frame().is_err(), "nothing after an error is trusted");

        let mut d = Decoder::new(|k| k == Kind::Stdout);
        d.feed(&encode(Kind::Record, b"x"));
        assert_eq!(d.next_frame(), Err(FrameError::Unexpected(Kind::Record)));

        let mut d = Decoder::new(|_| true);
        d.feed(&[Kind::Stdout as u8, 0xff, 0xff, 0xff, 0xff]);
        assert!(matches!(d.next_frame(), Err(FrameError::TooLarge { .. })));
        assert_eq!(d.pending(), 0, "an oversized frame is not buffered");
    }

    #[test]
    fn start_is_checked() {
        assert!(decode_start(b"").is_err());
        assert!(decode_start(&[0, 0, 0, 9, b'{']).is_err());
        let mut s = start();
        s.protocol = 1;
        let frame = encode_start(&s, b"");
        assert!(decode_start(&frame[HEADER_LEN..]).unwrap_err().contains("protocol"));
        let mut v = serde_json::to_value(start()).unwrap();
        v["extra"] = 1.into();
        let json = serde_json::to_vec(&v).unwrap();
        let mut body = (json.len() as u32).to_be_bytes().to_vec();
        body.extend(json);
        assert!(decode_start(&body).is_err(), "unknown fields are refused");
    }

    #[test]
    fn sealed_records_verify_only_with_their_key() {
        let key = parse_key(&"ab".repeat(KEY_LEN)).unwrap();
        let body = seal(&key, br#"{"x":1}"#);
        assert_eq!(open_sealed(&key, &body).unwrap(), br#"{"x":1}"#);
        let other = parse_key(&"cd".repeat(KEY_LEN)).unwrap();
        assert!(matches!(open_sealed(&other, &body), Err(ClaimError::BadMac)));
        let mut tampered = body.clone();
        *tampered.last_mut().unwrap() = b'2';
        assert!(open_sealed(&key, &tampered).is_err());
        assert!(open_sealed(&key, b"short").is_err());
        assert!(parse_key("zz").is_none());
        assert!(parse_key(&"g0".repeat(KEY_LEN)).is_none());
        // Found by the `takeover` fuzz target: a sign passed for a digit.
        assert!(parse_key(&format!("+0{}", "ab".repeat(KEY_LEN - 1))).is_none());
    }

    #[test]
    fn claims_are_capped_and_strict() {
        let big = vec![b' '; 100];
        assert!(matches!(parse_claim::<HandlerRecord>(&big, 10), Err(ClaimError::TooLarge(10))));
        let extra = br#"{"result":"ok","error":"","permanent":false,"fingerprint":"x","evil":1}"#;
        assert!(matches!(parse_claim::<HandlerRecord>(extra, 1000), Err(ClaimError::Invalid(_))));
        let good = br#"{"result":"ok","error":"","permanent":false,"fingerprint":"x"}"#;
        assert_eq!(parse_claim::<HandlerRecord>(good, 1000).unwrap().result, HandlerResult::Ok);
    }

    #[test]
    fn takeover_answers_need_the_key() {
        let key = parse_key(&"ab".repeat(KEY_LEN)).unwrap();
        let other = parse_key(&"cd".repeat(KEY_LEN)).unwrap();
        let id = "0123456789abcdef0123456789abcdef";
        let p = takeover_proof(&key, id, &[7; NONCE_LEN], 42);
        assert_eq!(p.len(), TAKEOVER_LEN);
        assert_eq!(takeover_open(&key, id, &p), Some(([7; NONCE_LEN], 42)));
        assert_eq!(takeover_open(&other, id, &p), None, "another key");
        assert_eq!(takeover_open(&key, "f123456789abcdef0123456789abcdef", &p), None, "another link");
        assert_eq!(takeover_open(&key, id, &p[..TAKEOVER_LEN - 1]), None, "short");
        let mut moved = p.clone();
        moved[NONCE_LEN + 7] ^= 1;
        assert_eq!(takeover_open(&key, id, &moved), None, "the resume point is covered by the MAC");
        assert!(valid_link_id(&"0f".repeat(16)));
        for bad in ["", "0F".repeat(16).as_str(), "0".repeat(31).as_str(), "../x"] {
            assert!(!valid_link_id(bad), "{bad}");
        }
    }

    #[test]
    fn a_large_frame_that_is_all_there_is_becomes_its_body_whole() {
        let payload = vec![7u8; 3 << 20];
        let frame = encode_start(&start(), &payload);
        let mut d = Decoder::new(|_| true);
        d.feed(&frame[..10]);
        assert!(d.next_frame().unwrap().is_none());
        d.feed(&frame[10..]);
        let f = d.next_frame().unwrap().expect("the frame");
        assert_eq!(d.pending(), 0);
        let (s, p) = decode_start_owned(f.body).unwrap();
        assert_eq!((s, p), (start(), payload));
        // And the decoder goes on after it.
        d.feed(&encode(Kind::Stop, b""));
        assert_eq!(d.next_frame().unwrap().map(|f| f.kind), Some(Kind::Stop));
    }

    #[test]
    fn a_resize_is_rows_then_columns() {
        let size = TermSize { rows: 40, cols: 120 };
        assert_eq!(resize_body(size), [0, 40, 0, 120]);
        assert_eq!(resize_of(&resize_body(size)), Some(size));
        assert_eq!(resize_of(&[0, 40, 0]), None);
        assert_eq!(Kind::from_byte(0x08), Some(Kind::Resize));
        assert_eq!(Kind::Resize.max_body(), 4);
    }

    #[test]
    fn names_and_text() {
        assert_eq!(escape_name(b"a/b c"), "a/b c");
        assert_eq!(escape_name(b"x\xffy"), "x\\xffy");
        assert_eq!(escape_name(b"n\nl"), "n\\nl");
        assert_eq!(cap_text("héllo", 2), "h");
        assert_eq!(cap_text("abc", 5), "abc");
    }
}
