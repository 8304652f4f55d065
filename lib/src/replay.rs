//! Running an attempt again from its Outcome (`stevedore replay`; `docs/outcome.md`,
//! "Replay"): the file is checked ([`read`]: valid JSON, an action of a known schema whose
//! digest is that of its fields), then what to run is rebuilt from the action ([`plan`]: the
//! image by id, the inputs checked against the tree digest, the secrets the Outcome does not
//! hold given again and checked against their HMACs), run `n` times ([`replay`]), and the runs
//! compared ([`compare`], [`phase_stats`]).
//!
//! The rung's part of the action (network, user, caches) is the rung's configuration: the
//! caller configures the rung it replays on from [`Replay::action`] (the command does).
//!
//! The digest proves that the fields agree, not who wrote them: anyone can edit an Outcome and
//! digest it again. So an action is trusted only when the caller says so
//! ([`ReplayOptions::trust`]) or when its MAC is that of the caller's action key
//! ([`Action::sealed_by`]: whoever holds that key wrote it). An untrusted action is run only
//! within what a plain attempt of the rung gets ([`ReplayOptions::defaults`]), and the inputs it
//! names are measured before anything of them is read.

use crate::contract::{
    ACTION_SCHEMA, Action, ActionKey, ActionTask, Executor, LaunchError, Limits, Outcome, Policy, Request,
    ResourceLimits,
};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use tokio_util::sync::CancellationToken;

/// Why an Outcome cannot be replayed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// the file is not an Outcome
    #[error("not an outcome's JSON")]
    Json(#[source] serde_json::Error),
    /// the Outcome has no action
    #[error("the outcome has no action (evidence.action): it was written by a stevedore without the action digest")]
    NoAction,
    /// the action's schema is not this build's
    #[error("the action's schema is {0:?}; this stevedore reads {ACTION_SCHEMA:?}")]
    Schema(String),
    /// the digest is not that of the fields
    #[error("the action's digest {recorded} is not that of its fields ({computed}): the file was changed")]
    Digest {
        /// What the file says.
        recorded: String,
        /// What its fields give.
        computed: String,
    },
    /// the attempt read a stdin
    #[error("the attempt read a stdin, whose bytes the outcome does not hold")]
    Stdin,
    /// the attempt had a terminal
    #[error("the attempt ran on a terminal, whose keystrokes and size the outcome does not hold")]
    Tty,
    /// the inputs cannot be read
    #[error("cannot read the inputs {path}")]
    Inputs {
        /// The input dir.
        path: PathBuf,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// the input dir is not named
    #[error("the attempt had inputs, and the outcome names no input dir: give --inputs DIR")]
    NoInputDir,
    /// the inputs are not the attempt's
    #[error(
        "the inputs in {path} changed: their tree digest is {now}, the attempt's was {then} (give --inputs DIR to run on a new set)"
    )]
    InputsChanged {
        /// The input dir.
        path: PathBuf,
        /// The attempt's tree digest.
        then: String,
        /// Theirs now.
        now: String,
    },
    /// environment values must be given again
    #[error("the outcome holds no environment values: give {} again (--env KEY=VALUE, or --env KEY for this environment's)", .0.join(", "))]
    EnvMissing(Vec<String>),
    /// environment values given that the attempt did not have
    #[error("the attempt had no environment variable {}", .0.join(", "))]
    EnvExtra(Vec<String>),
    /// environment values given that differ from the attempt's
    #[error("the values given for {} are not the attempt's (their HMACs differ)", .0.join(", "))]
    EnvDiffers(Vec<String>),
    /// the action key is not the attempt's
    #[error("the attempt's environment was digested under action key {then}, and {now}")]
    KeyDiffers {
        /// The attempt's key id.
        then: String,
        /// The key given, or that none was.
        now: String,
    },
    /// the payload must be given again
    #[error("the payload must be given again (its digest is {0})")]
    PayloadMissing(String),
    /// the payload given is not the attempt's
    #[error("the payload given is {given}, the attempt's was {then}")]
    PayloadDiffers {
        /// The attempt's payload digest.
        then: String,
        /// The one given.
        given: String,
    },
    /// an action nothing vouches for asks more than a plain attempt
    #[error(
        "the outcome asks for more than a plain attempt gets: {}; its digest proves only that its fields agree, not \
         who wrote them: give --trust for an outcome you trust, or the action key that sealed it",
        .0.join(", ")
    )]
    Untrusted(Vec<String>),
    /// the input dir the Outcome names is not the size the attempt staged
    #[error(
        "the input dir {path} is not the attempt's ({then_files} files, {then_bytes} bytes; it holds {now}): \
         not read (give --inputs DIR to run on a new set)"
    )]
    InputsDiffer {
        /// The input dir.
        path: PathBuf,
        /// The attempt's regular files.
        then_files: u64,
        /// Their bytes.
        then_bytes: u64,
        /// What it holds now, as far as it was measured.
        now: String,
    },
    /// the inputs are more than the rung stages
    #[error("the inputs in {path} are over the {limit} bytes the rung stages: not read")]
    InputsTooLarge {
        /// The input dir.
        path: PathBuf,
        /// The rung's limit.
        limit: u64,
    },
}

/// What a replay takes that the Outcome does not hold.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ReplayOptions {
    /// A new set of inputs: run on them, whatever their digest (the replay says so).
    pub inputs: Option<PathBuf>,
    /// The environment's values (the Outcome names the keys, never the values).
    pub env: BTreeMap<String, String>,
    /// The action key the values are checked under.
    pub key: Option<ActionKey>,
    /// The payload, when the attempt had one.
    pub payload: Option<Vec<u8>>,
    /// The caller trusts the Outcome (`--trust`): what it asks beyond a plain attempt (a
    /// network, caches, larger limits, a longer grace) is given. Without it, only an action
    /// `key` sealed is.
    pub trust: bool,
    /// The limits an attempt gets with no options on the rung the replay runs on (its
    /// configured defaults over its fallback: `ContainerConfig::default_limits`, …): an
    /// untrusted action asking more is refused. A dimension left out has no default ceiling
    /// there, so any amount is within it; but GPUs only come when asked.
    pub defaults: Limits,
    /// The most bytes of inputs the rung stages (its `max_input_bytes`): inputs larger are
    /// refused before they are read.
    pub max_input_bytes: u64,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        Self {
            inputs: None,
            env: BTreeMap::new(),
            key: None,
            payload: None,
            trust: false,
            // The container rung's fallback (`container/sizes.rs`) and input cap: the default rung.
            defaults: Limits::NONE.memory(1 << 30).pids(512).disk(512 << 20).nofile(4096),
            max_input_bytes: 4 << 30,
        }
    }
}

impl ReplayOptions {
    /// No inputs replaced, no values, no key, no payload, no trust; the container rung's
    /// defaults.
    pub fn new() -> Self {
        Self::default()
    }
}

/// What to run again: the request (its output dir is the caller's to set per run) and what
/// the replay changed.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Replay {
    /// The attempt's action, as the file holds it (checked).
    pub action: Action,
    /// The request rebuilt from it: the image by id, the argv, the environment given again,
    /// the inputs, the limits as asked, the timeout, the grace.
    pub request: Request,
    /// The inputs were replaced: the attempt's tree digest and the new set's.
    pub inputs_replaced: Option<(String, String)>,
    /// Environment keys whose values could not be checked (no key configured then or now).
    pub env_unchecked: Vec<String>,
    /// Why the action is trusted (`--trust`, or the action key that sealed it); `None`: it is
    /// not, and it asks nothing beyond a plain attempt: run it on the rung the caller chose,
    /// with that rung's defaults (no network, no caches).
    pub trusted: Option<String>,
}

/// The Outcome in `json`, with an action this build can replay: valid JSON, an action of
/// [`ACTION_SCHEMA`], whose digest is that of its fields.
pub fn read(json: &str) -> Result<Outcome, ReplayError> {
    // The schema is looked at before the whole is parsed: a later schema may not parse.
    let value: serde_json::Value = serde_json::from_str(json).map_err(ReplayError::Json)?;
    let action = value.get("evidence").and_then(|e| e.get("action")).ok_or(ReplayError::NoAction)?;
    let schema = action.get("schema").and_then(|s| s.as_str()).unwrap_or_default();
    if schema != ACTION_SCHEMA {
        return Err(ReplayError::Schema(schema.to_owned()));
    }
    let outcome: Outcome = serde_json::from_value(value).map_err(ReplayError::Json)?;
    let action = outcome.evidence.action.as_ref().ok_or(ReplayError::NoAction)?;
    let computed = action.compute_digest();
    if computed != action.digest {
        return Err(ReplayError::Digest { recorded: action.digest.clone(), computed });
    }
    Ok(outcome)
}

/// The tree digest of the input dir at `path` (`docs/outcome.md`, "Input tree digest"), as
/// staging computes it.
pub fn input_tree(path: &Path) -> Result<String, ReplayError> {
    crate::inputs::tree_digest(path)
        .map(|r| r.tree)
        .map_err(|e| ReplayError::Inputs { path: path.to_owned(), source: Box::new(e) })
}

/// What to run again of `outcome` (read by [`read`]), with what `opts` gives; refused when
/// the attempt read a stdin, the action is not trusted (`opts.trust`, or sealed by
/// `opts.key`) and asks more than a plain attempt ([`beyond_plain`]), the inputs the Outcome
/// names are not the attempt's size (measured before anything is read) or changed (unless
/// replaced), a value the Outcome does not hold is not given, a value given is not the
/// attempt's (with a key), or the payload is missing or another. The request's output dir is
/// empty: set it per run.
pub fn plan(outcome: &Outcome, opts: &ReplayOptions) -> Result<Replay, ReplayError> {
    let action = outcome.evidence.action.clone().ok_or(ReplayError::NoAction)?;
    if action.stdin {
        return Err(ReplayError::Stdin);
    }
    if action.tty {
        return Err(ReplayError::Tty);
    }
    let trusted = match &opts.key {
        Some(k) if action.sealed_by(k) => Some(format!("sealed by action key {}", k.id())),
        _ if opts.trust => Some("--trust".to_owned()),
        _ => None,
    };
    if trusted.is_none() {
        let asks = beyond_plain(&action, &opts.defaults);
        if !asks.is_empty() {
            return Err(ReplayError::Untrusted(asks));
        }
    }
    let job = format!("replay-{:08x}", rand::random::<u32>());
    let mut req = match &action.task {
        ActionTask::Handler(h) => Request::handler(job, h.clone(), PathBuf::new()),
        ActionTask::Command(argv) => Request::command(job, argv.clone(), PathBuf::new()),
    };
    req.entrypoint.clone_from(&action.entrypoint);
    req.workdir.clone_from(&action.workdir);
    req.fingerprint.clone_from(&action.fingerprint);
    req.prior_outputs.clone_from(&action.prior_outputs);
    req.limits = ResourceLimits(action.limits.clone());
    req.run_timeout = action.timeout_ms.map(std::time::Duration::from_millis);
    let mut policy = Policy::default().with_grace(std::time::Duration::from_millis(action.grace_ms));
    policy.image = action.image_id.clone().or_else(|| action.image.clone()).unwrap_or_default();
    req.policy = policy;
    // The environment first: it checks the key, under which the payload is digested too.
    let env_unchecked = environment(&action, opts, &mut req)?;
    // The payload.
    // Under the attempt's key when it had one: `environment` below refuses another key.
    let key = opts.key.as_ref().filter(|_| action.env_key.is_some());
    let empty = crate::contract::action::payload_digest(b"", key);
    match &opts.payload {
        Some(p) => {
            let given = crate::contract::action::payload_digest(p, key);
            if given != action.payload_sha256 {
                return Err(ReplayError::PayloadDiffers { then: action.payload_sha256.clone(), given });
            }
            req.payload.clone_from(p);
        }
        None if action.payload_sha256 != empty => return Err(ReplayError::PayloadMissing(action.payload_sha256)),
        None => {}
    }
    // The inputs.
    let mut inputs_replaced = None;
    if let Some(inputs) = &action.inputs {
        let dir = match (&opts.inputs, &action.input_dir) {
            (Some(d), _) => d.clone(),
            (None, Some(d)) => PathBuf::from(d),
            (None, None) => return Err(ReplayError::NoInputDir),
        };
        let now = if opts.inputs.is_some() {
            given_tree(&dir, opts.max_input_bytes)?
        } else {
            recorded_tree(&dir, inputs.files, inputs.bytes, opts.max_input_bytes)?
        };
        if now != inputs.tree {
            if opts.inputs.is_none() {
                return Err(ReplayError::InputsChanged { path: dir, then: inputs.tree.clone(), now });
            }
            inputs_replaced = Some((inputs.tree.clone(), now));
        }
        req.input_dir = Some(dir);
        req.inputs = inputs.slots.iter().map(|(k, v)| (k.clone(), PathBuf::from(v))).collect();
    } else if let Some(d) = &opts.inputs {
        inputs_replaced = Some(("no inputs".to_owned(), given_tree(d, opts.max_input_bytes)?));
        req.input_dir = Some(d.clone());
    }
    // Only where the attempt had one: a key it did not have would change the runs' digests.
    req.action_key = opts.key.clone().filter(|_| action.env_key.is_some());
    Ok(Replay { action, request: req, inputs_replaced, env_unchecked, trusted })
}

/// What `action` asks beyond what a plain attempt gets on a rung of `defaults`: limits above
/// them, GPUs, a grace longer than the default, caches, a container network. Words for people.
pub fn beyond_plain(action: &Action, defaults: &Limits) -> Vec<String> {
    let mut asks = Vec::new();
    for (key, amount) in action.limits.iter().filter(|(_, v)| **v > 0) {
        let default = defaults.dims().into_iter().find(|(k, _)| k == key).map(|(_, v)| v);
        match default {
            // GPUs are given only when asked for.
            Some(None) if key == crate::contract::limits::key::GPU => {
                asks.push(format!("{key} {amount} (none without options)"));
            }
            Some(Some(d)) if *amount > d => asks.push(format!("{key} {amount} (the rung's default is {d})")),
            // No default ceiling on that dimension, or a key the rungs ignore.
            _ => {}
        }
    }
    let grace = u64::try_from(Policy::default().grace().as_millis()).unwrap_or(u64::MAX);
    if action.grace_ms > grace {
        asks.push(format!("a grace of {} ms (the default is {grace} ms)", action.grace_ms));
    }
    for (name, path) in &action.caches {
        asks.push(format!("cache {name} at {path}"));
    }
    // The container rung's word for its network (the other rungs' words say what their
    // sandbox has, which a replay on the container rung does not ask for).
    if action.rung == "docker" && !matches!(action.network.as_str(), "" | "none") {
        asks.push(format!("network {}", action.network));
    }
    asks
}

fn inputs_error(path: &Path, e: crate::inputs::StageError) -> ReplayError {
    ReplayError::Inputs { path: path.to_owned(), source: Box::new(e) }
}

/// The tree digest of a dir the caller named, refused unread when over `limit` bytes.
fn given_tree(path: &Path, limit: u64) -> Result<String, ReplayError> {
    let dir = crate::inputs::InputDir::open(path).map_err(|e| inputs_error(path, e))?;
    if dir.measure_within(limit, u64::MAX).map_err(|e| inputs_error(path, e))?.is_none() {
        return Err(ReplayError::InputsTooLarge { path: path.to_owned(), limit });
    }
    tree_of(path, &dir, limit)
}

/// The tree digest of the dir an Outcome named, read only when it holds exactly the `files`
/// and `bytes` the attempt staged (measured from the entries' sizes first, stopping at the
/// first file past them) and those are within `limit`: a file cannot choose what replay reads.
fn recorded_tree(path: &Path, files: u64, bytes: u64, limit: u64) -> Result<String, ReplayError> {
    if bytes > limit {
        return Err(ReplayError::InputsTooLarge { path: path.to_owned(), limit });
    }
    let dir = crate::inputs::InputDir::open(path).map_err(|e| inputs_error(path, e))?;
    let differ =
        |now: String| ReplayError::InputsDiffer { path: path.to_owned(), then_files: files, then_bytes: bytes, now };
    match dir.measure_within(bytes, files).map_err(|e| inputs_error(path, e))? {
        Some(got) if got == (bytes, files) => tree_of(path, &dir, bytes),
        Some((b, f)) => Err(differ(format!("{f} files, {b} bytes"))),
        None => Err(differ("more".to_owned())),
    }
}

/// The tree digest of `dir`, reading at most `limit` bytes of files (one grown meanwhile is
/// refused, not read on).
fn tree_of(path: &Path, dir: &crate::inputs::InputDir, limit: u64) -> Result<String, ReplayError> {
    dir.write_tar(crate::inputs::Owners::User(0, 0), limit, std::io::sink(), &|_| {})
        .map(|r| r.tree)
        .map_err(|e| inputs_error(path, e))
}

/// Puts the values given into `req`, checked against the attempt's HMACs where a key allows;
/// the keys whose values could not be checked.
fn environment(action: &Action, opts: &ReplayOptions, req: &mut Request) -> Result<Vec<String>, ReplayError> {
    let missing: Vec<String> = action.env.keys().filter(|k| !opts.env.contains_key(*k)).cloned().collect();
    if !missing.is_empty() {
        return Err(ReplayError::EnvMissing(missing));
    }
    let extra: Vec<String> = opts.env.keys().filter(|k| !action.env.contains_key(*k)).cloned().collect();
    if !extra.is_empty() {
        return Err(ReplayError::EnvExtra(extra));
    }
    let mut unchecked = Vec::new();
    match (&action.env_key, &opts.key) {
        (Some(then), Some(key)) if *then != key.id() => {
            return Err(ReplayError::KeyDiffers { then: then.clone(), now: format!("the key given is {}", key.id()) });
        }
        (Some(then), None) if !action.env.is_empty() || action.payload_sha256.starts_with("hmac-") => {
            return Err(ReplayError::KeyDiffers {
                then: then.clone(),
                now: "none was given to check the values with".into(),
            });
        }
        (Some(_), Some(key)) => {
            let differ: Vec<String> = action
                .env
                .iter()
                .filter(|(k, hmac)| hmac.as_deref() != Some(key.env_value(k, &opts.env[*k]).as_str()))
                .map(|(k, _)| k.clone())
                .collect();
            if !differ.is_empty() {
                return Err(ReplayError::EnvDiffers(differ));
            }
        }
        _ => unchecked = action.env.keys().cloned().collect(),
    }
    req.env.clone_from(&opts.env);
    Ok(unchecked)
}

const PHASE_ORDER: [&str; 8] = [
    "prepared_ms",
    "inputs_staged_ms",
    "created_ms",
    "started_ms",
    "command_started_ms",
    "command_ended_ms",
    "outputs_collected_ms",
    "concluded_ms",
];

/// How the runs' outputs compare: the same names with the same digests in every run, or
/// the names that differ (present in some runs only, or with different digests).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Comparison {
    /// Every run gave the same outputs.
    pub identical: bool,
    /// The outputs that differ between runs.
    pub differing: BTreeSet<String>,
}

/// Compares the runs' outputs by name and digest.
pub fn compare(runs: &[Outcome]) -> Comparison {
    let maps: Vec<BTreeMap<&str, &str>> =
        runs.iter().map(|o| o.outputs.iter().map(|f| (f.name.as_str(), f.hash.as_str())).collect()).collect();
    let names: BTreeSet<&str> = maps.iter().flat_map(|m| m.keys().copied()).collect();
    let differing: BTreeSet<String> = names
        .into_iter()
        .filter(|n| maps.iter().map(|m| m.get(n)).collect::<BTreeSet<_>>().len() > 1)
        .map(str::to_owned)
        .collect();
    Comparison { identical: differing.is_empty(), differing }
}

/// Each phase's mean and standard deviation (of the population) over the runs that reached
/// it, in ms, by the phase's name in `evidence.phases`, in the phases' order.
pub fn phase_stats(runs: &[Outcome]) -> Vec<(String, (f64, f64))> {
    let mut seen: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for o in runs {
        if let Ok(serde_json::Value::Object(m)) = serde_json::to_value(&o.evidence.phases) {
            for (k, v) in m {
                if let Some(ms) = v.as_u64() {
                    seen.entry(k).or_default().push(ms as f64);
                }
            }
        }
    }
    // The phases in the order an attempt reaches them (a JSON map of them would sort them).
    let mut order: Vec<String> = PHASE_ORDER.iter().map(|s| (*s).to_owned()).filter(|k| seen.contains_key(k)).collect();
    order.extend(seen.keys().filter(|k| !order.contains(k)).cloned().collect::<Vec<_>>());
    order
        .into_iter()
        .filter_map(|k| seen.remove_entry(&k))
        .map(|(k, xs)| {
            let n = xs.len() as f64;
            let mean = xs.iter().sum::<f64>() / n;
            let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
            (k, (mean, var.sqrt()))
        })
        .collect()
}

/// Runs `replay` `n` times on `executor`, each run's outputs in `outputs/run-<i>` (1-based);
/// the Outcomes, in order. The executor must be configured as the action's rung part says
/// (network, user, caches): this runs what the request holds.
pub async fn replay(
    executor: &dyn Executor,
    replay: &Replay,
    n: u32,
    outputs: &Path,
    cancel: CancellationToken,
) -> Result<Vec<Outcome>, LaunchError> {
    let mut runs = Vec::new();
    for i in 1..=n {
        let mut req = replay.request.clone();
        req.output_dir = outputs.join(format!("run-{i}"));
        runs.push(executor.run(&req, cancel.clone()).await?);
    }
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::{Level, OutputFile, Status};

    fn outcome_of(req: &Request) -> Outcome {
        let mut a = Action::of_request(req, "docker", Some(Level::Sandboxed));
        a.image_id = Some("sha256:aa".into());
        a.image = Some("busybox:latest".into());
        a.seal(&BTreeMap::new(), &BTreeMap::new(), req.action_key.as_ref());
        let mut o = Outcome::new(Status::Ok);
        o.evidence.action = Some(a);
        o
    }

    fn base() -> Request {
        Request::command("j", ["sh", "-c", "date > /out/t"], "/o")
    }

    #[test]
    fn a_file_is_refused_unless_its_digest_is_its_fields() {
        let json = outcome_of(&base()).to_json();
        let o = read(&json).unwrap();
        let r = plan(&o, &ReplayOptions::new()).unwrap();
        assert_eq!(r.request.policy.image, "sha256:aa", "the image by id");
        assert_eq!(
            r.request.task,
            crate::contract::Task::Command(vec!["sh".into(), "-c".into(), "date > /out/t".into()])
        );
        assert!(matches!(read("{"), Err(ReplayError::Json(_))));
        assert!(matches!(read(&Outcome::new(Status::Ok).to_json()), Err(ReplayError::NoAction)));
        let tampered = json.replace("date > /out/t", "date > /out/u");
        assert!(matches!(read(&tampered), Err(ReplayError::Digest { .. })));
        let schema = json.replace(ACTION_SCHEMA, "stevedore-action/9");
        assert!(matches!(read(&schema), Err(ReplayError::Schema(s)) if s == "stevedore-action/9"));
        // Not digested: the tag may be edited (the id runs).
        assert!(read(&json.replace("busybox:latest", "other:1")).is_ok());
    }

    #[test]
    fn secrets_are_given_again_and_checked() {
        let o = outcome_of(&base().env("TOKEN", "s"));
        let err = plan(&o, &ReplayOptions::new()).unwrap_err();
        assert!(err.to_string().contains("TOKEN"), "{err}");
        let mut opts = ReplayOptions::new();
        opts.env.insert("TOKEN".into(), "anything".into());
        assert_eq!(plan(&o, &opts).unwrap().env_unchecked, ["TOKEN"], "no key: nothing to check against");
        let key = ActionKey::new(*b"a key of 16 bytes").unwrap();
        let o = outcome_of(&base().env("TOKEN", "s").action_key(key.clone()));
        assert!(matches!(plan(&o, &opts), Err(ReplayError::KeyDiffers { .. })));
        opts.key = Some(key);
        assert!(matches!(plan(&o, &opts), Err(ReplayError::EnvDiffers(k)) if k == ["TOKEN"]));
        opts.env.insert("TOKEN".into(), "s".into());
        let r = plan(&o, &opts).unwrap();
        assert!(r.env_unchecked.is_empty());
        assert_eq!(r.request.env["TOKEN"], "s");
        let o = outcome_of(&base().payload(*b"p"));
        assert!(matches!(plan(&o, &ReplayOptions::new()), Err(ReplayError::PayloadMissing(_))));
    }

    #[test]
    fn inputs_are_checked_against_the_tree_digest() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("in");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("x"), b"1").unwrap();
        let req = base().input_dir(&dir);
        let mut o = outcome_of(&req);
        let a = o.evidence.action.as_mut().unwrap();
        let inputs = a.inputs.as_mut().unwrap();
        inputs.tree = input_tree(&dir).unwrap();
        (inputs.files, inputs.bytes) = (1, 1);
        a.digest = a.compute_digest();
        let r = plan(&o, &ReplayOptions::new()).unwrap();
        assert_eq!((r.request.input_dir.as_deref(), r.inputs_replaced), (Some(dir.as_path()), None));
        std::fs::write(dir.join("x"), b"2").unwrap();
        assert!(matches!(plan(&o, &ReplayOptions::new()), Err(ReplayError::InputsChanged { .. })));
        let opts = ReplayOptions { inputs: Some(dir.clone()), ..ReplayOptions::new() };
        let (then, now) = plan(&o, &opts).unwrap().inputs_replaced.unwrap();
        assert_ne!(then, now);
    }

    /// Issue 41, 1: an Outcome whose fields were changed and digested again (another rung, a
    /// network, raised limits, a cache) is refused unless trusted, naming each ask; the
    /// caller's `--trust` or the MAC of the caller's key lets it through; a MAC under another
    /// key does not.
    #[test]
    fn a_forged_action_gets_no_more_than_a_plain_attempt_unless_trusted() {
        let forge = |o: &Outcome, f: &dyn Fn(&mut Action)| {
            let mut o = o.clone();
            let a = o.evidence.action.as_mut().unwrap();
            f(a);
            a.digest = a.compute_digest();
            read(&o.to_json()).unwrap()
        };
        let genuine = outcome_of(&base());
        let raised = forge(&genuine, &|a| {
            a.network = "bridge".into();
            a.limits.insert("memory".into(), 16 << 30);
            a.limits.insert("pids".into(), 1_000_000);
            a.limits.insert("gpu".into(), 1000);
            a.grace_ms = 3_600_000;
            a.caches.insert("c".into(), "/c".into());
        });
        let err = plan(&raised, &ReplayOptions::new()).unwrap_err();
        let said = err.to_string();
        for word in ["network bridge", "memory 17179869184", "pids 1000000", "gpu 1000", "grace of 3600000", "cache c"]
        {
            assert!(said.contains(word), "{word:?} not in {said}");
        }
        assert!(matches!(err, ReplayError::Untrusted(_)));
        let told = ReplayOptions { trust: true, ..ReplayOptions::new() };
        assert_eq!(plan(&raised, &told).unwrap().trusted.as_deref(), Some("--trust"));
        // Within the defaults (and another rung's word for its network): nothing to trust.
        let within = forge(&genuine, &|a| {
            a.rung = "process".into();
            a.network = "host".into();
            a.limits.insert("memory".into(), 64 << 20);
            a.limits.insert("cpu".into(), 500);
        });
        let p = plan(&within, &ReplayOptions::new()).unwrap();
        assert_eq!(p.trusted, None, "run untrusted: on the caller's rung, with its defaults");
        // Sealed by the caller's key: trusted as whoever holds it; forged after, not.
        let key = ActionKey::new(*b"a key of 16 bytes").unwrap();
        let sealed = outcome_of(&base().action_key(key.clone()));
        let sealed_raised = {
            let mut o = sealed.clone();
            let a = o.evidence.action.as_mut().unwrap();
            a.network = "bridge".into();
            a.digest = a.compute_digest();
            a.mac = Some(key.action_mac(a));
            o
        };
        let with_key = ReplayOptions { key: Some(key.clone()), ..ReplayOptions::new() };
        let p = plan(&sealed_raised, &with_key).unwrap();
        assert_eq!(p.trusted, Some(format!("sealed by action key {}", key.id())));
        let forged = forge(&sealed, &|a| a.network = "bridge".into());
        assert!(matches!(plan(&forged, &with_key), Err(ReplayError::Untrusted(_))), "the MAC no longer passes");
        let other = ActionKey::new(*b"another key of 16 bytes").unwrap();
        let mut by_other = sealed_raised.clone();
        let a = by_other.evidence.action.as_mut().unwrap();
        a.mac = Some(other.action_mac(a));
        assert!(matches!(plan(&by_other, &with_key), Err(ReplayError::Untrusted(_))), "another key's MAC");
    }

    /// Issue 41, 1: the input dir an Outcome names is measured from its entries' sizes before
    /// anything is read: a terabyte (sparse) in place of the attempt's one byte, or a tree of
    /// more files, is refused unread; over the rung's input cap likewise.
    #[test]
    fn the_inputs_an_outcome_names_are_measured_before_they_are_read() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("in");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("x"), b"1").unwrap();
        let mut o = outcome_of(&base().input_dir(&dir));
        let a = o.evidence.action.as_mut().unwrap();
        let inputs = a.inputs.as_mut().unwrap();
        inputs.tree = input_tree(&dir).unwrap();
        (inputs.files, inputs.bytes) = (1, 1);
        a.digest = a.compute_digest();
        assert!(plan(&o, &ReplayOptions::new()).is_ok());
        // A sparse terabyte: refused from its size (a read of it would take hours).
        let f = std::fs::File::create(dir.join("x")).unwrap();
        f.set_len(1 << 40).unwrap();
        let started = std::time::Instant::now();
        let err = plan(&o, &ReplayOptions::new()).unwrap_err();
        assert!(matches!(&err, ReplayError::InputsDiffer { now, .. } if now == "more"), "{err}");
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "refused unread: {:?}", started.elapsed());
        // More files than the attempt had: refused at the first one past.
        std::fs::write(dir.join("x"), b"1").unwrap();
        std::fs::write(dir.join("y"), b"").unwrap();
        assert!(matches!(plan(&o, &ReplayOptions::new()), Err(ReplayError::InputsDiffer { .. })));
        std::fs::remove_file(dir.join("y")).unwrap();
        // The attempt's own size over the rung's cap: refused before the walk.
        let small = ReplayOptions { max_input_bytes: 0, ..ReplayOptions::new() };
        assert!(matches!(plan(&o, &small), Err(ReplayError::InputsTooLarge { .. })));
        // A dir the caller names is theirs, within the cap.
        let given = ReplayOptions { inputs: Some(dir.clone()), max_input_bytes: 0, ..ReplayOptions::new() };
        assert!(matches!(plan(&o, &given), Err(ReplayError::InputsTooLarge { .. })));
    }

    #[test]
    fn runs_compare_by_name_and_digest() {
        let run = |files: &[(&str, &str)], ms: u64| {
            let mut o = Outcome::new(Status::Ok);
            o.outputs = files
                .iter()
                .map(|(n, h)| OutputFile { name: (*n).into(), size: 1, hash: (*h).into(), content_type: String::new() })
                .collect();
            o.evidence.phases.prepared_ms = Some(ms);
            o
        };
        let same = [run(&[("y", "h1")], 2), run(&[("y", "h1")], 4)];
        assert!(compare(&same).identical);
        assert_eq!(phase_stats(&same), [("prepared_ms".to_owned(), (3.0, 1.0))]);
        let differ = [run(&[("y", "h1"), ("t", "a")], 1), run(&[("y", "h1"), ("t", "b")], 1), run(&[("y", "h1")], 1)];
        let c = compare(&differ);
        assert!(!c.identical);
        assert_eq!(c.differing.into_iter().collect::<Vec<_>>(), ["t"]);
    }
}
