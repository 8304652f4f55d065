//! The action of an attempt: everything that can change its result, and one digest over it
//! (`docs/outcome.md`, "Action digest"). The digest is computed by one function
//! ([`Action::compute_digest`]) when the attempt runs and when `replay` checks a file.
//!
//! Environment values never enter as plain hashes (a reader of the Outcome could try every
//! likely value): only as an HMAC under a key the user holds ([`ActionKey`]), or not at all.
//!
//! The digest says the fields agree, not who wrote them: anyone can edit a field and digest
//! again. Under a key the whole action is also MACed ([`Action::mac`]), so that `replay` can
//! tell an action the same key sealed from one anyone could have written.

use super::{Level, PriorOutput, Request, Task};
use crate::util::hex;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// The schema of [`Action`] this build writes and reads; another is refused by `replay`.
pub const ACTION_SCHEMA: &str = "stevedore-action/1";

/// The environment variable naming the file that holds the action key (the CLI reads it).
pub const ACTION_KEY_FILE_ENV: &str = "STEVEDORE_ACTION_KEY_FILE";

/// The keys of [`Action`]'s JSON left out of its digest: the digest itself, the image's
/// tag (a name that may move: the id is digested), the input dir's path (the tree's digest
/// is what counts, wherever it lies), the applied limits' digest (they depend on the
/// machine; digested apart), and the MAC (over all the rest, the digest included).
pub const NOT_DIGESTED: [&str; 5] = ["digest", "image", "input_dir", "applied_limits_digest", "mac"];

/// What the action's MAC is computed over begins with these bytes, beside the payload's
/// (`stevedore-payload/1\0`) and the environment's (`stevedore-env/1\0`): a MAC of one kind
/// never passes for another.
const MAC_PREFIX: &[u8] = b"stevedore-action/1\0";

/// A key shorter than this is refused: a key someone can guess lets them forge MACs and try
/// values against the HMACs.
pub const MIN_KEY_BYTES: usize = 16;

/// What an attempt ran, as far as anything of it can change the result, and its digest.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Action {
    /// [`ACTION_SCHEMA`].
    pub schema: String,
    /// `sha256:<hex>` over the other fields but [`NOT_DIGESTED`] ([`Action::compute_digest`]).
    pub digest: String,
    /// The rung that ran it (`docker`, `process`, `kube`, `inprocess`).
    pub rung: String,
    /// Its isolation level.
    pub level: Option<Level>,
    /// The image as named (not digested: a tag may move).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The image by id (`sha256:…`); `None` on a rung without images (process, in-process).
    pub image_id: Option<String>,
    /// What ran: `{"command": [argv…]}` or `{"handler": "name"}`.
    pub task: ActionTask,
    /// The request's replacement of the image's `ENTRYPOINT`, if any.
    pub entrypoint: Option<Vec<String>>,
    /// The request's working directory, if any (else the image's).
    pub workdir: Option<String>,
    /// `sha256:<hex>` of the payload (of no bytes when there is none).
    pub payload_sha256: String,
    /// The handler set's fingerprint the request expected.
    pub fingerprint: Option<String>,
    /// Outputs of earlier steps passed through.
    pub prior_outputs: Vec<PriorOutput>,
    /// The request's environment: key → `hmac-sha256:<hex>` under the action key, or `null`
    /// when no key was configured (the values are then left out, and `env_key` is `null`).
    pub env: BTreeMap<String, Option<String>>,
    /// Which action key made the HMACs (its id, [`ActionKey::id`]); `None`: values left out.
    pub env_key: Option<String>,
    /// The input tree staged, `None` without an input dir.
    pub inputs: Option<ActionInputs>,
    /// Where the input dir was, as the request named it (not digested; `replay` looks there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_dir: Option<String>,
    /// The limits as requested: the request's map after the rung's configured defaults and
    /// ceilings (a profile's limits); what the rung applied is digested apart.
    pub limits: BTreeMap<String, u64>,
    /// The command's own time limit (`Request::run_timeout`), in ms.
    pub timeout_ms: Option<u64>,
    /// The grace between SIGTERM and SIGKILL, in ms.
    pub grace_ms: u64,
    /// The network the sandbox had (`none`, `bridge`, `host`, `cluster`, …).
    pub network: String,
    /// Whom the command ran as (`UID:GID`, or how the rung chooses it).
    pub user: String,
    /// The root filesystem is read-only.
    pub read_only_root: bool,
    /// Named caches mounted: name → path (their content is outside the action).
    pub caches: BTreeMap<String, String>,
    /// `sha256:<hex>` of stevedore's init that ran the attempt; `None` in-process.
    pub init: Option<String>,
    /// The command had a stdin (its bytes are not in the action: such an attempt cannot be
    /// replayed as it was).
    pub stdin: bool,
    /// The command had a terminal.
    pub tty: bool,
    /// `sha256:<hex>` of the limits as the rung applied and skipped them (`evidence.enforcement`
    /// and `evidence.skipped`): they depend on the machine, so they are digested apart.
    pub applied_limits_digest: String,
    /// `hmac-sha256:<hex>` under the action key of `stevedore-action/1\0` and the canonical JSON
    /// of every other field (the digest, the tag, the input dir and the applied limits' digest
    /// included): whoever holds the key sealed this action ([`Action::sealed_by`]). `None`
    /// without a key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
}

/// What an attempt ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ActionTask {
    /// A plain command's argv.
    Command(Vec<String>),
    /// A handler, by name.
    Handler(String),
}

impl Default for ActionTask {
    fn default() -> Self {
        ActionTask::Command(Vec::new())
    }
}

/// The input tree an attempt was given.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ActionInputs {
    /// The tree's digest, `sha256:<hex>` (`docs/outcome.md`, "Input tree digest").
    pub tree: String,
    /// Regular files in it.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Named slots: name → path relative to the input dir.
    pub slots: BTreeMap<String, String>,
}

/// Why an action key could not be had.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ActionKeyError {
    /// the key file cannot be read
    #[error("cannot read the action key file {path}")]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// the key is empty
    #[error("the action key is empty{}", .0.as_ref().map(|p| format!(" (file {})", p.display())).unwrap_or_default())]
    Empty(Option<std::path::PathBuf>),
    /// the key is too short to be a secret
    #[error(
        "the action key{} is {len} bytes; it must be at least {MIN_KEY_BYTES} (e.g. `head -c 32 /dev/urandom > FILE`)",
        .path.as_ref().map(|p| format!(" in {}", p.display())).unwrap_or_default()
    )]
    Short {
        /// The file, when it came from one.
        path: Option<std::path::PathBuf>,
        /// Its length.
        len: usize,
    },
    /// others can read the key file
    #[error("the action key file {0} can be read by others (mode {1:o}): chmod 600 it")]
    Readable(std::path::PathBuf, u32),
    /// the key file belongs to another user
    #[error("the action key file {0} belongs to uid {1}, not to this user or root")]
    NotOwned(std::path::PathBuf, u32),
    /// the key file is not a file of the user's own making
    #[error("refusing the action key file {path}: {why}")]
    Untrusted {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        why: String,
    },
}

/// The key environment values are HMACed under: the user's own, so that the same key gives
/// the same digest on every machine, and a reader of the Outcome without it learns nothing
/// of the values. Its `Debug` shows its id, never the key.
#[derive(Clone, PartialEq, Eq)]
pub struct ActionKey(Arc<[u8]>);

impl std::fmt::Debug for ActionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ActionKey({})", self.id())
    }
}

impl ActionKey {
    /// A key of these bytes; one shorter than [`MIN_KEY_BYTES`] is refused.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Self, ActionKeyError> {
        let bytes = bytes.into();
        match bytes.len() {
            0 => Err(ActionKeyError::Empty(None)),
            len if len < MIN_KEY_BYTES => Err(ActionKeyError::Short { path: None, len }),
            _ => Ok(Self(bytes.into())),
        }
    }

    /// The key in `path`: its bytes, less one trailing newline (`echo` writes one).
    ///
    /// A key anyone knows protects nothing and forges every MAC, so the file is refused unless
    /// it is one the user made for it: opened without following a symlink and without
    /// blocking (a FIFO must not hang the command), then checked through that same descriptor
    /// (the file checked is the file read): a regular file, not on a pseudo-filesystem whose
    /// files everyone can read or know (proc, sysfs, cgroup, devpts: `/proc/self/personality`
    /// is root's and 0400), owned by this user or root, readable by no group or other, of at
    /// least [`MIN_KEY_BYTES`]; and its directory writable by no one else unless it is this
    /// user's (else another user could put their own file there).
    pub fn from_file(path: &Path) -> Result<Self, ActionKeyError> {
        use nix::errno::Errno;
        use nix::fcntl::OFlag;
        use nix::sys::stat::{Mode, fstat};
        use nix::sys::statfs::{
            CGROUP_SUPER_MAGIC, CGROUP2_SUPER_MAGIC, DEVPTS_SUPER_MAGIC, PROC_SUPER_MAGIC, SYSFS_MAGIC, fstatfs,
        };
        use std::io::Read;
        let read = |source: std::io::Error| ActionKeyError::Read { path: path.to_owned(), source };
        let refuse = |why: &str| ActionKeyError::Untrusted { path: path.to_owned(), why: why.to_owned() };
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC;
        let fd = match nix::fcntl::open(path, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::ELOOP) => return Err(refuse("it is a symlink (name the file itself)")),
            Err(e) => return Err(read(e.into())),
        };
        let st = fstat(&fd).map_err(|e| read(e.into()))?;
        if st.st_mode & nix::libc::S_IFMT != nix::libc::S_IFREG {
            return Err(refuse("it is not a regular file (a FIFO, a device, a directory?)"));
        }
        let fs = fstatfs(&fd).map_err(|e| read(e.into()))?.filesystem_type();
        let pseudo = [
            (PROC_SUPER_MAGIC, "proc"),
            (SYSFS_MAGIC, "sysfs"),
            (CGROUP_SUPER_MAGIC, "cgroup"),
            (CGROUP2_SUPER_MAGIC, "cgroup2"),
            (DEVPTS_SUPER_MAGIC, "devpts"),
        ];
        if let Some((_, name)) = pseudo.iter().find(|(magic, _)| *magic == fs) {
            return Err(refuse(&format!("it is on {name}, whose files are the system's, not a secret of the user's")));
        }
        let euid = nix::unistd::geteuid().as_raw();
        if st.st_uid != euid && st.st_uid != 0 {
            return Err(ActionKeyError::NotOwned(path.to_owned(), st.st_uid));
        }
        let mode = st.st_mode & 0o777;
        if mode & 0o077 != 0 {
            return Err(ActionKeyError::Readable(path.to_owned(), mode));
        }
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let dst = nix::sys::stat::stat(dir).map_err(|e| read(e.into()))?;
        // Writable by someone else: its group, anyone, or an owner that is neither this user
        // nor root.
        let others_write = dst.st_mode & 0o022 != 0 || (dst.st_uid != 0 && dst.st_mode & 0o200 != 0);
        if others_write && dst.st_uid != euid {
            return Err(refuse(&format!(
                "its directory {} (uid {}, mode {:o}) can be written by others, who could put their own file there",
                dir.display(),
                dst.st_uid,
                dst.st_mode & 0o7777
            )));
        }
        let mut bytes = Vec::new();
        // A key is short; the cap keeps a huge file from holding the command.
        std::fs::File::from(fd).take(64 << 10).read_to_end(&mut bytes).map_err(read)?;
        if bytes.ends_with(b"\n") {
            bytes.pop();
            if bytes.ends_with(b"\r") {
                bytes.pop();
            }
        }
        Self::new(bytes).map_err(|e| match e {
            ActionKeyError::Short { len, .. } => ActionKeyError::Short { path: Some(path.to_owned()), len },
            _ => ActionKeyError::Empty(Some(path.to_owned())),
        })
    }

    /// The key in the file [`ACTION_KEY_FILE_ENV`] names; `None` when it is unset or empty.
    pub fn from_env() -> Result<Option<Self>, ActionKeyError> {
        match std::env::var_os(ACTION_KEY_FILE_ENV) {
            Some(p) if !p.is_empty() => Self::from_file(Path::new(&p)).map(Some),
            _ => Ok(None),
        }
    }

    /// HMAC-SHA256 of `msg` under the key (RFC 2104).
    pub fn hmac(&self, msg: &[u8]) -> [u8; 32] {
        hmac_sha256(&self.0, msg)
    }

    /// The MAC of `action` under the key: `hmac-sha256:` and the hex of HMAC-SHA256 of
    /// `stevedore-action/1\0` and the canonical JSON of every field but `mac`.
    pub fn action_mac(&self, action: &Action) -> String {
        use hmac::Mac;
        format!("hmac-sha256:{}", hex(&self.action_hmac(action).finalize().into_bytes()))
    }

    fn action_hmac(&self, action: &Action) -> hmac::Hmac<Sha256> {
        use hmac::Mac;
        let mut v = serde_json::to_value(action).expect("an action always serialises");
        if let serde_json::Value::Object(m) = &mut v {
            m.remove("mac");
        }
        let mut text = String::new();
        canonical_json(&v, &mut text);
        let mut mac = hmac::Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes a key of any length");
        mac.update(MAC_PREFIX);
        mac.update(text.as_bytes());
        mac
    }

    /// Names the key without revealing it: the first 16 hex digits of HMAC(key, "stevedore key id").
    pub fn id(&self) -> String {
        hex(&self.hmac(b"stevedore key id")[..8])
    }

    /// A payload as the action holds it under a key: HMAC-SHA256 of `stevedore-payload/1\0`
    /// and its bytes (a plain hash would let a reader try likely payloads).
    pub fn payload_value(&self, payload: &[u8]) -> String {
        let mut msg = Vec::with_capacity(20 + payload.len());
        msg.extend_from_slice(b"stevedore-payload/1\0");
        msg.extend_from_slice(payload);
        format!("hmac-sha256:{}", hex(&self.hmac(&msg)))
    }

    /// An environment value as the action holds it: HMAC-SHA256 of
    /// `stevedore-env/1\0KEY\0VALUE`.
    pub fn env_value(&self, key: &str, value: &str) -> String {
        let mut msg = Vec::with_capacity(17 + key.len() + value.len());
        msg.extend_from_slice(b"stevedore-env/1\0");
        msg.extend_from_slice(key.as_bytes());
        msg.push(0);
        msg.extend_from_slice(value.as_bytes());
        format!("hmac-sha256:{}", hex(&self.hmac(&msg)))
    }
}

/// The payload's digest in an action: `hmac-sha256:` under the action key when there is one,
/// else `sha256:` (a low-entropy secret payload then needs the key).
pub fn payload_digest(payload: &[u8], key: Option<&ActionKey>) -> String {
    key.map_or_else(|| sha256_of(payload), |k| k.payload_value(payload))
}

/// HMAC-SHA256 (RFC 2104), by the `hmac` crate the init's link already uses.
pub(crate) fn hmac_sha256(key: &[u8], msg: &[u8]) -> [u8; 32] {
    use hmac::Mac;
    let mut mac = hmac::Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(msg);
    mac.finalize().into_bytes().into()
}

/// `sha256:<hex>` of `bytes`.
pub(crate) fn sha256_of(bytes: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(bytes)))
}

/// Writes `v` as canonical JSON: no whitespace, every object's keys sorted by their bytes,
/// strings and numbers as `serde_json` writes them (only `"`, `\` and control characters
/// escaped; the same bytes as Python's `json.dumps(v, sort_keys=True, separators=(",", ":"),
/// ensure_ascii=False)`). Sorted here, not by the map's order, so a build of `serde_json`
/// that keeps insertion order gives the same bytes.
pub(crate) fn canonical_json(v: &serde_json::Value, out: &mut String) {
    use serde_json::Value;
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                canonical_json(&m[k], out);
            }
            out.push('}');
        }
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical_json(x, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

impl Action {
    /// The action of `req` on rung `rung` at `level`: the request's part, with the key's HMACs
    /// of its environment. The rung's part (image id, network, user, init, caches, applied
    /// limits) is the caller's to set; then `Action::seal`.
    pub fn of_request(req: &Request, rung: &str, level: Option<Level>) -> Self {
        let key = req.action_key.as_ref();
        let env = req.env.iter().map(|(k, v)| (k.clone(), key.map(|key| key.env_value(k, v)))).collect();
        let inputs = req.input_dir.as_ref().map(|_| ActionInputs {
            slots: req.inputs.iter().map(|(k, v)| (k.clone(), v.display().to_string())).collect(),
            ..ActionInputs::default()
        });
        Self {
            schema: ACTION_SCHEMA.to_owned(),
            rung: rung.to_owned(),
            level,
            task: match &req.task {
                Task::Command(argv) => ActionTask::Command(argv.clone()),
                Task::Handler(h) => ActionTask::Handler(h.clone()),
            },
            entrypoint: req.entrypoint.clone(),
            workdir: req.workdir.clone(),
            payload_sha256: payload_digest(&req.payload, key),
            fingerprint: req.fingerprint.clone(),
            prior_outputs: req.prior_outputs.clone(),
            env,
            env_key: key.map(ActionKey::id),
            inputs,
            // Absolute, so that `replay` finds it from wherever it runs.
            input_dir: req
                .input_dir
                .as_ref()
                .map(|d| std::path::absolute(d).unwrap_or_else(|_| d.clone()).display().to_string()),
            limits: req.limits.0.clone(),
            timeout_ms: req.run_timeout.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
            grace_ms: u64::try_from(req.policy.grace().as_millis()).unwrap_or(u64::MAX),
            stdin: req.stdin.is_some(),
            tty: req.tty.is_some(),
            ..Self::default()
        }
    }

    /// Sets the input tree's digest and size, as staging found them.
    pub(crate) fn staged(&mut self, staged: Option<&super::InputsStaged>) {
        if let (Some(inputs), Some(s)) = (&mut self.inputs, staged) {
            inputs.tree = s.tree.clone().unwrap_or_default();
            inputs.files = s.files;
            inputs.bytes = s.bytes;
        }
    }

    /// Digests the applied limits (apart) and the whole action; under `key`, MACs it.
    pub(crate) fn seal(
        &mut self,
        enforcement: &BTreeMap<String, String>,
        skipped: &BTreeMap<String, String>,
        key: Option<&ActionKey>,
    ) {
        let applied = serde_json::json!({ "enforcement": enforcement, "skipped": skipped });
        let mut text = String::new();
        canonical_json(&applied, &mut text);
        self.applied_limits_digest = sha256_of(text.as_bytes());
        self.digest = self.compute_digest();
        self.mac = key.map(|k| k.action_mac(self));
    }

    /// Whether `key` sealed this action: its MAC is that of every other field under the key
    /// (compared in constant time). Such an action is as trustworthy as whoever holds the key,
    /// and no more.
    pub fn sealed_by(&self, key: &ActionKey) -> bool {
        use hmac::Mac;
        let Some(recorded) = self.mac.as_deref().and_then(|m| m.strip_prefix("hmac-sha256:")) else {
            return false;
        };
        crate::util::unhex(recorded).is_some_and(|bytes| key.action_hmac(self).verify_slice(&bytes).is_ok())
    }

    /// The digest of this action's fields: `sha256:` and the hex of SHA-256 over the bytes
    /// `stevedore-action/1\n` followed by the canonical JSON (`canonical_json`) of the action
    /// as serialised, less the keys in [`NOT_DIGESTED`].
    pub fn compute_digest(&self) -> String {
        let mut v = serde_json::to_value(self).expect("an action always serialises");
        if let serde_json::Value::Object(m) = &mut v {
            for k in NOT_DIGESTED {
                m.remove(k);
            }
        }
        let mut text = format!("{ACTION_SCHEMA}\n");
        canonical_json(&v, &mut text);
        sha256_of(text.as_bytes())
    }

    /// Whether the digest is that of the fields.
    pub fn digest_matches(&self) -> bool {
        self.digest == self.compute_digest()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 4231, test cases 1, 2 and 6 (a key longer than a block).
    #[test]
    fn hmac_sha256_is_rfc_4231s() {
        let h = |k: &[u8], m: &[u8]| hex(&hmac_sha256(k, m));
        assert_eq!(h(&[0x0b; 20], b"Hi There"), "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
        assert_eq!(
            h(b"Jefe", b"what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_eq!(
            h(&[0xaa; 131], b"Test Using Larger Than Block-Size Key - Hash Key First"),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    fn req() -> Request {
        Request::command("j", ["sh", "-c", "cat /in/x > /out/y"], "/o").worker("w")
    }

    fn sealed(r: &Request) -> Action {
        let mut a = Action::of_request(r, "docker", Some(Level::Sandboxed));
        a.image_id = Some("sha256:aa".into());
        a.network = "none".into();
        a.user = "65532:65532".into();
        a.init = Some("sha256:11".into());
        a.seal(&BTreeMap::new(), &BTreeMap::new(), r.action_key.as_ref());
        a
    }

    /// The digest of a known action, written down: the format never changes under a schema.
    #[test]
    fn a_known_action_has_a_known_digest() {
        let a = sealed(&req());
        assert_eq!(a.schema, ACTION_SCHEMA);
        assert!(a.digest_matches());
        assert_eq!(a.digest, sealed(&req()).digest, "the same request twice, the same digest");
        assert_eq!(
            a.digest,
            "sha256:2d406b3f43419dbb13dd3a14d357f6bdcf65c5ef11ad704dcb8a9a70e169e943",
            "{}",
            serde_json::to_string(&a).unwrap()
        );
    }

    /// Every digested field changes the digest; the tag, the applied limits and the job's
    /// identity (job id, attempt, worker) do not.
    #[test]
    fn each_field_changes_the_digest() {
        let base = sealed(&req());
        let differs = |what: &str, f: &dyn Fn(&mut Action)| {
            let mut a = base.clone();
            f(&mut a);
            assert_ne!(a.compute_digest(), base.digest, "{what} is not digested");
        };
        differs("image_id", &|a| a.image_id = Some("sha256:bb".into()));
        differs("argv", &|a| a.task = ActionTask::Command(vec!["sh".into()]));
        differs("handler", &|a| a.task = ActionTask::Handler("sh".into()));
        differs("entrypoint", &|a| a.entrypoint = Some(vec![]));
        differs("workdir", &|a| a.workdir = Some("/w".into()));
        differs("payload", &|a| a.payload_sha256 = sha256_of(b"p"));
        differs("fingerprint", &|a| a.fingerprint = Some("fp".into()));
        differs("prior outputs", &|a| a.prior_outputs.push(PriorOutput { name: "a".into(), reference: "r".into() }));
        differs("env key", &|a| {
            a.env.insert("A".into(), None);
        });
        differs("env value", &|a| {
            a.env.insert("A".into(), Some("hmac-sha256:00".into()));
        });
        differs("env_key", &|a| a.env_key = Some("0011".into()));
        differs("inputs", &|a| a.inputs = Some(ActionInputs::default()));
        differs("input tree", &|a| {
            a.inputs = Some(ActionInputs { tree: "sha256:01".into(), ..ActionInputs::default() })
        });
        differs("input slots", &|a| {
            a.inputs = Some(ActionInputs { slots: [("s".into(), "x".into())].into(), ..ActionInputs::default() })
        });
        differs("limits", &|a| {
            a.limits.insert("memory".into(), 64 << 20);
        });
        differs("timeout", &|a| a.timeout_ms = Some(1000));
        differs("grace", &|a| a.grace_ms = 1);
        differs("rung", &|a| a.rung = "process".into());
        differs("level", &|a| a.level = Some(Level::Process));
        differs("network", &|a| a.network = "bridge".into());
        differs("user", &|a| a.user = "0:0".into());
        differs("read-only root", &|a| a.read_only_root = true);
        differs("caches", &|a| {
            a.caches.insert("deps".into(), "/cache".into());
        });
        differs("init", &|a| a.init = Some("sha256:22".into()));
        differs("stdin", &|a| a.stdin = true);
        differs("tty", &|a| a.tty = true);
        differs("schema", &|a| a.schema = "stevedore-action/2".into());
        let same = |what: &str, f: &dyn Fn(&mut Action)| {
            let mut a = base.clone();
            f(&mut a);
            assert_eq!(a.compute_digest(), base.digest, "{what} is digested");
        };
        same("the tag", &|a| a.image = Some("busybox:latest".into()));
        same("the applied limits", &|a| a.applied_limits_digest = sha256_of(b"x"));
        same("the input dir's path", &|a| a.input_dir = Some("/elsewhere".into()));
        let other = sealed(&req().attempt(2).worker("w2"));
        assert_eq!(other.digest, base.digest, "the job's identity is not the action");
        let mut applied = base.clone();
        applied.seal(&[("memory".into(), "cgroup".into())].into(), &BTreeMap::new(), None);
        assert_ne!(applied.applied_limits_digest, base.applied_limits_digest);
        assert_eq!(applied.digest, base.digest);
    }

    /// Without a key the values are left out: two values, one digest. With one they count,
    /// and the key never appears.
    #[test]
    fn under_a_key_the_payload_is_an_hmac_no_reader_can_try_payloads_against() {
        let payload = |p: &[u8], key: Option<ActionKey>| {
            let mut r = req().payload(p.to_vec());
            if let Some(k) = key {
                r = r.action_key(k);
            }
            sealed(&r).payload_sha256
        };
        assert_eq!(payload(b"yes", None), sha256_of(b"yes"), "without a key, a plain digest");
        let key = ActionKey::new(*b"correct horse battery staple").unwrap();
        let (yes, no) = (payload(b"yes", Some(key.clone())), payload(b"no", Some(key.clone())));
        assert!(yes.starts_with("hmac-sha256:") && yes != no && yes != sha256_of(b"yes"), "{yes}");
        assert_eq!(yes, payload_digest(b"yes", Some(&key)), "what replay checks against");
    }

    #[test]
    fn env_values_enter_only_through_the_key() {
        let a = sealed(&req().env("TOKEN", "one"));
        let b = sealed(&req().env("TOKEN", "two"));
        assert_eq!(a.env["TOKEN"], None);
        assert_eq!(a.env_key, None, "the digest says the values were left out");
        assert_eq!(a.digest, b.digest);
        let key = ActionKey::new(*b"correct horse battery staple").unwrap();
        let with = |v: &str| sealed(&req().env("TOKEN", v).action_key(key.clone()));
        let (a, b) = (with("one"), with("two"));
        assert_ne!(a.digest, b.digest);
        assert_ne!(a.digest, sealed(&req().env("TOKEN", "one")).digest);
        assert_eq!(a.env_key.as_deref(), Some(key.id().as_str()));
        assert_eq!(a.digest, with("one").digest, "the same key, the same digest");
        let json = serde_json::to_string(&a).unwrap();
        assert!(!json.contains("correct horse") && !json.contains("\"one\""), "{json}");
        assert!(!format!("{key:?}").contains("horse"));
        let other = ActionKey::new(*b"another key of 16+ bytes").unwrap();
        assert_ne!(sealed(&req().env("TOKEN", "one").action_key(other)).digest, a.digest);
        assert!(a.env["TOKEN"].as_deref().unwrap().starts_with("hmac-sha256:"));
    }

    #[test]
    fn key_files_are_the_users_own() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("key");
        std::fs::write(&f, "s3cret of 16 bytes\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(ActionKey::from_file(&f), Err(ActionKeyError::Readable(..))));
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        let key = ActionKey::new(*b"s3cret of 16 bytes").unwrap();
        assert_eq!(ActionKey::from_file(&f).unwrap(), key, "one newline dropped");
        std::fs::write(&f, "\n").unwrap();
        assert!(matches!(ActionKey::from_file(&f), Err(ActionKeyError::Empty(Some(_)))));
        std::fs::write(&f, "password\n").unwrap();
        let err = ActionKey::from_file(&f).unwrap_err();
        assert!(matches!(err, ActionKeyError::Short { len: 8, .. }), "{err}");
        assert!(err.to_string().contains("at least 16"), "{err}");
        assert!(matches!(ActionKey::new(*b"short"), Err(ActionKeyError::Short { path: None, len: 5 })));
        assert!(ActionKey::from_file(&t.path().join("none")).is_err());
    }

    /// Issue 41, 3: a symlink planted at the key path onto a root-owned 0400 pseudo-file whose
    /// content everyone knows was taken for the key; a FIFO there hung the command. Each is
    /// refused by name, at once, and so is the same file reached without a symlink.
    #[test]
    fn a_planted_symlink_a_pseudo_file_and_a_fifo_are_never_a_key() {
        let t = tempfile::tempdir().unwrap();
        let link = t.path().join("key");
        std::os::unix::fs::symlink("/proc/self/personality", &link).unwrap();
        let err = ActionKey::from_file(&link).unwrap_err();
        assert!(matches!(&err, ActionKeyError::Untrusted { why, .. } if why.contains("symlink")), "{err}");
        // The pseudo-file named directly: root's and 0400 (as the attack needed), yet refused.
        let err = ActionKey::from_file(Path::new("/proc/self/personality")).unwrap_err();
        assert!(matches!(&err, ActionKeyError::Untrusted { why, .. } if why.contains("proc")), "{err}");
        let fifo = t.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        // A hang here would hold the test forever: the open does not wait for a writer.
        let err = ActionKey::from_file(&fifo).unwrap_err();
        assert!(matches!(&err, ActionKeyError::Untrusted { why, .. } if why.contains("regular")), "{err}");
    }

    /// A key in a directory others can write to (not the user's) is refused: another user could
    /// have put it there. The user's own such directory is theirs to keep.
    #[test]
    fn a_key_in_a_directory_others_can_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let shared = t.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
        let f = shared.join("key");
        std::fs::write(&f, "0123456789abcdef").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(ActionKey::from_file(&f).is_ok(), "the user's own open directory is theirs");
        let euid = nix::unistd::geteuid().as_raw();
        // Another owner for the directory, who alone can write it: only root can give one away.
        if euid == 0 {
            nix::unistd::chown(&shared, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
            std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o755)).unwrap();
            let err = ActionKey::from_file(&f).unwrap_err();
            assert!(
                matches!(&err, ActionKeyError::Untrusted { why, .. } if why.contains("written by others")),
                "{err}"
            );
        }
    }

    /// The MAC covers every field (the undigested ones too) under the key: a field changed and
    /// the digest made again no longer passes; another key never passes; no key, no MAC.
    #[test]
    fn only_the_key_that_sealed_an_action_vouches_for_it() {
        let key = ActionKey::new(*b"correct horse battery staple").unwrap();
        let a = sealed(&req().action_key(key.clone()));
        assert!(a.mac.as_deref().is_some_and(|m| m.starts_with("hmac-sha256:")), "{:?}", a.mac);
        assert!(a.sealed_by(&key));
        assert_eq!(a.digest, sealed(&req().action_key(key.clone())).digest);
        assert!(!a.sealed_by(&ActionKey::new(*b"another key of 16+ bytes").unwrap()));
        let forged = |f: &dyn Fn(&mut Action)| {
            let mut b = a.clone();
            f(&mut b);
            b.digest = b.compute_digest();
            assert!(b.digest_matches());
            assert!(!b.sealed_by(&key), "{b:?}");
        };
        forged(&|b| b.rung = "process".into());
        forged(&|b| b.network = "bridge".into());
        forged(&|b| b.task = ActionTask::Command(vec!["sh".into()]));
        forged(&|b| b.input_dir = Some("/etc".into()));
        forged(&|b| b.image = Some("other:1".into()));
        forged(&|b| b.limits.insert("memory".into(), 16 << 30).map_or((), |_| ()));
        forged(&|b| b.mac = Some("hmac-sha256:zz".into()));
        forged(&|b| b.mac = None);
        let plain = sealed(&req());
        assert_eq!(plain.mac, None, "no key, no MAC");
        assert!(!plain.sealed_by(&key));
        assert!(!serde_json::to_string(&plain).unwrap().contains("\"mac\""), "absent, not null");
    }

    /// The canonical JSON is what Python's `json.dumps(sort_keys=True, separators=(",", ":"),
    /// ensure_ascii=False)` writes.
    #[test]
    fn canonical_json_sorts_and_escapes_as_documented() {
        let v = serde_json::json!({"b": [1, "x\ny\u{1}\"é"], "a": {"d": null, "c": true}});
        let mut s = String::new();
        canonical_json(&v, &mut s);
        assert_eq!(s, "{\"a\":{\"c\":true,\"d\":null},\"b\":[1,\"x\\ny\\u0001\\\"é\"]}");
    }
}
