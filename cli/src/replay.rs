//! `stevedore replay OUTCOME.json`: the attempt again, as its action says (`docs/outcome.md`,
//! "Replay"), `-n` times; each run's status and output digests, whether the runs' outputs
//! were identical (a cheap test for non-determinism), and the phases' spread.

use crate::common::{Global, RungKind};
use crate::error::CliError;
use crate::run::{self, RunArgs};
use clap::Parser;
use std::path::PathBuf;
use stevedore::contract::{LaunchError, Outcome};
use stevedore::handlers::Handlers;
use stevedore::replay::{self as lib, ReplayOptions};

/// Arguments of `stevedore replay`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Checks the file first: valid JSON, an action of a known schema (evidence.action) whose digest
is that of its fields, the inputs' tree digest (the input dir the attempt named, or --inputs),
the environment values and the payload given again (the Outcome holds neither; with the
action key they are checked against its HMACs). Runs the image by id, never by tag.

The digest proves that the fields agree, not who wrote them. Unless --trust is given or the
action's MAC is that of your action key (whoever holds the key sealed it), the replay gets no
more than `stevedore run` with no options: the rung given with --rung (default the container
rung), no network, no caches, limits within the rung's defaults, the recorded deadline; the
input dir the Outcome names is read only when it holds the attempt's file count and bytes.
What will run is printed first.

Exit status: 0 every run ok and all outputs identical, 1 the outputs differed, 2 a run was
not ok (outputs identical or not), 125 refused (the reason on stderr).")]
pub struct ReplayArgs {
    /// The attempt's Outcome JSON (`stevedore run --outcome FILE`)
    #[arg(value_name = "OUTCOME.json")]
    outcome: PathBuf,
    /// How many times to run it
    #[arg(short = 'n', long = "runs", default_value_t = 1, value_name = "N")]
    runs: u32,
    /// Run on this input dir instead, whatever its digest (the output says so)
    #[arg(long, value_name = "DIR")]
    inputs: Option<PathBuf>,
    /// Run on this rung (container, process, kube) rather than the attempt's
    #[arg(long, value_name = "RUNG", value_enum)]
    rung: Option<RungKind>,
    /// An environment variable's value again; KEY alone takes this environment's (repeatable)
    #[arg(long = "env", short = 'e', value_name = "K=V|K")]
    env: Vec<String>,
    /// The payload again, from a file
    #[arg(long, value_name = "FILE", conflicts_with = "payload")]
    payload_file: Option<PathBuf>,
    /// The payload again
    #[arg(long, value_name = "STR")]
    payload: Option<String>,
    /// The action key (default: $STEVEDORE_ACTION_KEY_FILE): environment values and the payload
    /// are checked under it, and an Outcome it sealed is trusted (whoever holds the key wrote it)
    #[arg(long, value_name = "FILE")]
    action_key_file: Option<PathBuf>,
    /// Where the runs' outputs go, as DIR/run-N (default: a new dir under $TMPDIR, kept)
    #[arg(long, value_name = "DIR")]
    output: Option<PathBuf>,
    /// Show the command's output live
    #[arg(long)]
    live: bool,
    /// Worker ID of the runs (default: a unique one)
    #[arg(long, value_name = "ID")]
    worker: Option<String>,
    /// Give the runs what the Outcome asks beyond a plain attempt (its rung, a network,
    /// caches, larger limits or grace): only for an Outcome you trust. An Outcome sealed by
    /// your action key needs no --trust
    #[arg(long)]
    trust: bool,
}

/// `run`'s options as a replay sets them, parsed as `run` parses its own.
#[derive(Debug, Parser)]
struct AsRun {
    #[command(flatten)]
    run: RunArgs,
}

/// Runs `stevedore replay`.
pub async fn replay(g: &Global, a: ReplayArgs, handlers: &Handlers) -> u8 {
    match replay_all(g, &a, handlers).await {
        Ok(code) => code,
        Err(e) => e.said(),
    }
}

/// The refusal of replaying `what`, said with it.
fn refused(what: &str, why: impl std::fmt::Display) -> CliError {
    CliError::Refused(format!("replay {what}: {why}"))
}

/// The options given again: the key, the environment's values, the payload, the inputs.
fn options(a: &ReplayArgs) -> Result<ReplayOptions, CliError> {
    let mut opts = ReplayOptions::new();
    opts.inputs.clone_from(&a.inputs);
    opts.key = run::action_key(a.action_key_file.as_deref())?;
    for kv in &a.env {
        if let Some((k, v)) = run::env_pair(kv, "--env")? {
            opts.env.insert(k, v);
        }
    }
    opts.payload = match (&a.payload, &a.payload_file) {
        (Some(p), _) => Some(p.clone().into_bytes()),
        (None, Some(f)) => Some(crate::common::read_payload(f).map_err(|e| format!("--payload-file: {e}"))?),
        (None, None) => None,
    };
    opts.trust = a.trust;
    Ok(opts)
}

/// The rung of the runs: `--rung`, else, trusted, the attempt's; untrusted, the container rung,
/// as `stevedore run`'s (a file must not choose the process rung, which has the host's network).
fn rung_of_runs(a: &ReplayArgs, recorded: &str, trusted: bool, what: &str) -> Result<RungKind, CliError> {
    match (a.rung, trusted) {
        (Some(r), _) => Ok(r),
        (None, false) => Ok(RungKind::Container),
        (None, true) => RungKind::of_name(recorded).ok_or_else(|| {
            refused(
                what,
                format!(
                    "the attempt ran on rung {recorded:?}, which the command does not run (the library's \
                     stevedore::replay::replay does); give --rung"
                ),
            )
        }),
    }
}

/// What will run, printed before anything does.
fn announce(plan: &lib::Replay, runs: u32, rung: RungKind, g: &Global) {
    let action = &plan.action;
    let runs = format!("{runs} run{}", if runs == 1 { "" } else { "s" });
    println!("replaying action {} ({runs}, rung {rung})", action.digest);
    match &plan.trusted {
        Some(why) => println!("  trusted: {why}"),
        None => println!(
            "  not trusted (no --trust, no MAC of your action key): run as a plain attempt of rung {rung}{}",
            if RungKind::of_name(&action.rung) == Some(rung) {
                String::new()
            } else {
                format!(" (it ran on {})", action.rung)
            }
        ),
    }
    println!("  {}", describe(action, rung, plan.trusted.is_some(), &plan.request, g));
    if let Some((then, now)) = &plan.inputs_replaced {
        println!("inputs replaced: digest {then} → {now}");
    }
    if !plan.env_unchecked.is_empty() {
        println!(
            "environment not checked (no action key then): {}; the values given are used as they are",
            plan.env_unchecked.join(", ")
        );
    }
}

/// Checks the file, plans, announces and runs it `-n` times; the exit status.
async fn replay_all(g: &Global, a: &ReplayArgs, handlers: &Handlers) -> Result<u8, CliError> {
    let what = a.outcome.display().to_string();
    let text = crate::common::read_outcome_text(&a.outcome).map_err(|e| format!("replay: {e}"))?;
    let outcome = lib::read(&text).map_err(|e| refused(&what, stevedore::error_chain(&e)))?;
    let mut opts = options(a)?;
    let recorded = outcome.evidence.action.as_ref().ok_or_else(|| refused(&what, "the outcome has no action"))?;
    let trusted = a.trust || opts.key.as_ref().is_some_and(|k| recorded.sealed_by(k));
    let rung = rung_of_runs(a, &recorded.rung, trusted, &what)?;
    (opts.defaults, opts.max_input_bytes) = rung_bounds(g, rung).map_err(|e| refused(&what, e))?;
    let plan = lib::plan(&outcome, &opts).map_err(|e| refused(&what, stevedore::error_chain(&e)))?;
    announce(&plan, a.runs, rung, g);
    let base = match &a.output {
        Some(d) => d.clone(),
        // Made here, new and private (never a directory another local user placed first),
        // and kept: the runs' outputs are what the user came for.
        None => tempfile::Builder::new()
            .prefix("stevedore-replay-")
            .tempdir()
            .map_err(|e| refused(&what, format!("a directory for the runs' outputs: {e}")))?
            .keep(),
    };
    let (runs, stopped) = run_all(g, a, &plan, rung, &base, handlers).await?;
    if let Some(code) = stopped {
        return Ok(code);
    }
    Ok(conclude(&runs, &base))
}

/// The runs, each in `base/run-N`; with the exit status a signal asked for, if one came.
async fn run_all(
    g: &Global,
    a: &ReplayArgs,
    plan: &lib::Replay,
    rung: RungKind,
    base: &std::path::Path,
    handlers: &Handlers,
) -> Result<(Vec<Outcome>, Option<u8>), CliError> {
    let what = a.outcome.display().to_string();
    let action = &plan.action;
    let worker = a.worker.clone().unwrap_or_else(crate::common::mint_worker);
    let mut runs: Vec<Outcome> = Vec::new();
    for i in 1..=a.runs.max(1) {
        let out = base.join(format!("run-{i}"));
        let args = run_args(action, rung, plan.trusted.is_some(), &out, a.live).map_err(|e| refused(&what, e))?;
        let mut req = plan.request.clone();
        req.output_dir = out.clone();
        req.worker_id.clone_from(&worker);
        let (ended, got, _) = run::execute(g, &args, req, handlers, false).await?;
        let mut o = match ended {
            Some(Ok(o)) => o,
            Some(Err(LaunchError::ImageUnavailable { image, why, .. })) => {
                return Err(refused(
                    &what,
                    format!(
                        "the attempt's image {image} is gone from this engine ({why}); it was tagged {}: build or \
                         pull it again (a tag that now names another image would not replay the attempt)",
                        action.image.as_deref().unwrap_or("(no tag)")
                    ),
                ));
            }
            Some(Err(e)) => return Err(refused(&what, format!("run {i}: {}", stevedore::error_chain(&e)))),
            None => return Ok((runs, Some(got.unwrap_or(130)))),
        };
        run::drop_captures(&mut o);
        say_run(i, &o, &action.digest, &out);
        runs.push(o);
        if got.is_some() {
            return Ok((runs, got));
        }
    }
    Ok((runs, None))
}

/// Whether the runs' outputs agree, their phases' spread, where they are; the exit status.
fn conclude(runs: &[Outcome], base: &std::path::Path) -> u8 {
    let cmp = lib::compare(runs);
    if cmp.identical {
        println!("outputs: identical in all {} runs", runs.len());
    } else {
        let names: Vec<&str> = cmp.differing.iter().map(String::as_str).collect();
        println!("outputs: differ between runs: {}", names.join(", "));
    }
    if runs.len() > 1 {
        let stats = lib::phase_stats(runs);
        let line: Vec<String> = stats.iter().map(|(k, (m, s))| format!("{k} {m:.1} ± {s:.1}")).collect();
        println!("phases (mean ± stddev over {} runs, ms): {}", runs.len(), line.join(", "));
    }
    println!("outputs in {}", base.display());
    if runs.iter().any(|o| o.status != stevedore::contract::Status::Ok) {
        2
    } else if !cmp.identical {
        1
    } else {
        0
    }
}

/// What will run, on one line, every text escaped: what the rung will really give, not what
/// the Outcome says it had.
fn describe(
    action: &stevedore::contract::Action,
    rung: RungKind,
    trusted: bool,
    req: &stevedore::contract::Request,
    g: &Global,
) -> String {
    use stevedore::contract::ActionTask;
    let p = stevedore_init::wire::printable;
    let task = match &action.task {
        ActionTask::Command(argv) => format!("command {}", p(&format!("{argv:?}"))),
        ActionTask::Handler(h) => format!("handler {}", p(h)),
        _ => "a task of another build".to_owned(),
    };
    let image = match (&action.image_id, &action.image) {
        (Some(id), Some(tag)) => format!("image {} ({})", p(id), p(tag)),
        (Some(id), None) => format!("image {}", p(id)),
        _ => "no image".to_owned(),
    };
    let (network, user, caches) = match rung {
        RungKind::Container if trusted => {
            let caches: Vec<String> = action.caches.iter().map(|(n, path)| format!("{}:{}", p(n), p(path))).collect();
            let net = if action.network.is_empty() { "the profile's".to_owned() } else { p(&action.network) };
            let user = if stevedore::contract::parse_user(&action.user).is_some() {
                p(&action.user)
            } else {
                "the rung's".to_owned()
            };
            (net, user, caches)
        }
        RungKind::Container => ("none".to_owned(), "the rung's".to_owned(), Vec::new()),
        RungKind::Process => (
            "the host's (the process rung does not isolate the network)".to_owned(),
            "the process rung's (its own uid as root)".to_owned(),
            Vec::new(),
        ),
        _ if g.network_denied => ("none (the namespace denies it)".to_owned(), "the rung's".to_owned(), Vec::new()),
        _ => ("the cluster's (no NetworkPolicy said to deny it)".to_owned(), "the rung's".to_owned(), Vec::new()),
    };
    let limits: Vec<String> =
        req.limits.0.iter().filter(|(_, v)| **v > 0).map(|(k, v)| format!("{}={v}", p(k))).collect();
    let limits = if limits.is_empty() {
        "the rung's default limits".to_owned()
    } else {
        format!("limits {} (the rest the rung's defaults)", limits.join(" "))
    };
    let timeout = req.run_timeout.map_or_else(|| "no timeout".to_owned(), |t| format!("timeout {} ms", t.as_millis()));
    let inputs = req
        .input_dir
        .as_ref()
        .map_or_else(|| "no inputs".to_owned(), |d| format!("inputs {}", p(&d.display().to_string())));
    format!(
        "{task}, {image}, network {network}, user {user}{}, {limits}, {timeout}, {inputs}",
        if caches.is_empty() { String::new() } else { format!(", caches {}", caches.join(" ")) }
    )
}

/// The limits an attempt with no options gets on `rung` and the bytes of inputs it stages.
fn rung_bounds(g: &Global, rung: RungKind) -> Result<(stevedore::contract::Limits, u64), String> {
    match rung {
        RungKind::Process => {
            let cfg = stevedore::process::ProcessConfig::default();
            Ok((cfg.default_limits(), cfg.max_input_bytes))
        }
        RungKind::Kube => crate::kube::config(g).map(|c| (c.default_limits(), c.max_input_bytes)),
        RungKind::Container => crate::common::config(g).map(|c| (c.default_limits(), c.max_input_bytes)),
    }
}

/// One run's line and its outputs' digests.
fn say_run(i: u32, o: &Outcome, digest: &str, out: &std::path::Path) {
    let exit = o.exit_code.map(|c| format!(" exit {c}")).unwrap_or_default();
    let same = match o.evidence.action.as_ref().map(|a| a.digest.as_str()) {
        Some(d) if d == digest => "the same action".to_owned(),
        Some(d) => format!("action {d}: not the attempt's (another rung or machine?)"),
        None => "no action".to_owned(),
    };
    println!("run {i}: {}{exit}, {same}, outputs in {}", o.status, out.display());
    for f in &o.outputs {
        println!("  {}  {}", f.hash, stevedore_init::wire::printable(&f.name));
    }
}

/// `run`'s options for one run: the rung, the output dir, and the rung's part of the action
/// (the container rung's network, user and caches; its image by id, never pulled) when the
/// action is trusted; else the rung's own with no network.
fn run_args(
    action: &stevedore::contract::Action,
    rung: RungKind,
    trusted: bool,
    out: &std::path::Path,
    live: bool,
) -> Result<RunArgs, String> {
    let mut argv: Vec<String> = vec!["replay".into(), "--rung".into(), rung.name().into()];
    argv.extend(["--output".into(), out.display().to_string()]);
    if !live {
        argv.push("--quiet".into());
    }
    if rung == RungKind::Container {
        argv.extend(["--pull".into(), "never".into()]);
        if !trusted {
            argv.extend(["--network".into(), "none".into()]);
            return AsRun::try_parse_from(argv).map(|r| r.run).map_err(|e| e.to_string());
        }
        if !action.network.is_empty() {
            argv.extend(["--network".into(), action.network.clone()]);
        }
        if stevedore::contract::parse_user(&action.user).is_some() {
            argv.extend(["--user".into(), action.user.clone()]);
        }
        for (name, path) in &action.caches {
            argv.extend(["--cache".into(), format!("{name}:{path}")]);
        }
    }
    AsRun::try_parse_from(argv).map(|r| r.run).map_err(|e| e.to_string())
}
