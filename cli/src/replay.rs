//! `stevedore replay OUTCOME.json`: the attempt again, as its action says (`docs/outcome.md`,
//! "Replay"), `-n` times; each run's status and output digests, whether the runs' outputs
//! were identical (a cheap test for non-determinism), and the phases' spread.

use crate::common::Global;
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
    #[arg(long, value_name = "RUNG", value_parser = ["container", "process", "kube"])]
    rung: Option<String>,
    /// An environment variable's value again; KEY alone takes this environment's (repeatable)
    #[arg(long = "env", short = 'e', value_name = "K=V|K")]
    env: Vec<String>,
    /// The payload again, from a file
    #[arg(long, value_name = "FILE", conflicts_with = "payload")]
    payload_file: Option<PathBuf>,
    /// The payload again
    #[arg(long, value_name = "STR")]
    payload: Option<String>,
    /// The action key (default: $STEVEDORE_ACTION_KEY_FILE)
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
    /// Give the runs what the Outcome asks beyond a plain sandbox (a network other than none
    /// or bridge, named caches): only for an Outcome you trust
    #[arg(long)]
    trust: bool,
}

/// `run`'s options as a replay sets them, parsed as `run` parses its own.
#[derive(Debug, Parser)]
struct AsRun {
    #[command(flatten)]
    run: RunArgs,
}

fn refuse(msg: impl std::fmt::Display) -> u8 {
    crate::say::say(msg);
    125
}

/// The command's rung for the action's (`docker` is the container rung's name).
fn rung_of(name: &str) -> Option<&'static str> {
    match name {
        "docker" | "container" => Some("container"),
        "process" => Some("process"),
        "kube" => Some("kube"),
        _ => None,
    }
}

/// Runs `stevedore replay`.
pub async fn replay(g: &Global, a: ReplayArgs, handlers: &Handlers) -> u8 {
    let what = a.outcome.display().to_string();
    let text = match crate::common::read_outcome_text(&a.outcome) {
        Ok(t) => t,
        Err(e) => return refuse(format!("replay: {e}")),
    };
    let outcome = match lib::read(&text) {
        Ok(o) => o,
        Err(e) => return refuse(format!("replay {what}: {}", stevedore::error_chain(&e))),
    };
    let mut opts = ReplayOptions::new();
    opts.inputs.clone_from(&a.inputs);
    opts.key = match run::action_key(a.action_key_file.as_deref()) {
        Ok(k) => k,
        Err(e) => return refuse(e),
    };
    for kv in &a.env {
        match run::env_pair(kv, "--env") {
            Ok(Some((k, v))) => {
                opts.env.insert(k, v);
            }
            Ok(None) => {}
            Err(e) => return refuse(e),
        }
    }
    opts.payload = match (&a.payload, &a.payload_file) {
        (Some(p), _) => Some(p.clone().into_bytes()),
        (None, Some(f)) => match crate::common::read_payload(f) {
            Ok(b) => Some(b),
            Err(e) => return refuse(format!("--payload-file: {e}")),
        },
        (None, None) => None,
    };
    let plan = match lib::plan(&outcome, &opts) {
        Ok(p) => p,
        Err(e) => return refuse(format!("replay {what}: {}", stevedore::error_chain(&e))),
    };
    let action = &plan.action;
    let Some(rung) = a.rung.as_deref().or_else(|| rung_of(&action.rung)) else {
        return refuse(format!(
            "replay {what}: the attempt ran on rung {:?}, which the command does not run (the library's \
             stevedore::replay::replay does); give --rung",
            action.rung
        ));
    };
    // The digest proves the fields agree, not who wrote them: what widens the sandbox comes
    // only with --trust, and what will run is said first.
    let widening: Vec<String> = std::iter::once(&action.network)
        .filter(|n| rung == "container" && !matches!(n.as_str(), "" | "none" | "bridge" | "default"))
        .map(|n| format!("network {n}"))
        .chain(action.caches.iter().filter(|_| rung == "container").map(|(n, p)| format!("cache {n} at {p}")))
        .collect();
    if !widening.is_empty() && !a.trust {
        return refuse(format!(
            "replay {what}: the attempt had {}: an Outcome file can ask for anything; give --trust to replay an \
             Outcome you trust with them",
            widening.join(", ")
        ));
    }
    println!("replaying action {} ({} run{}, rung {rung})", action.digest, a.runs, if a.runs == 1 { "" } else { "s" });
    println!("  {}", describe(action));
    if let Some((then, now)) = &plan.inputs_replaced {
        println!("inputs replaced: digest {then} → {now}");
    }
    if !plan.env_unchecked.is_empty() {
        println!(
            "environment not checked (no action key then): {}; the values given are used as they are",
            plan.env_unchecked.join(", ")
        );
    }
    let base = match &a.output {
        Some(d) => d.clone(),
        // Made here, new and private (never a directory another local user placed first),
        // and kept: the runs' outputs are what the user came for.
        None => match tempfile::Builder::new().prefix("stevedore-replay-").tempdir() {
            Ok(d) => d.keep(),
            Err(e) => return refuse(format!("replay {what}: a directory for the runs' outputs: {e}")),
        },
    };
    let worker = a.worker.clone().unwrap_or_else(crate::common::mint_worker);
    let mut runs: Vec<Outcome> = Vec::new();
    for i in 1..=a.runs.max(1) {
        let out = base.join(format!("run-{i}"));
        let args = match run_args(action, rung, &out, a.live) {
            Ok(r) => r,
            Err(e) => return refuse(format!("replay {what}: {e}")),
        };
        let mut req = plan.request.clone();
        req.output_dir = out.clone();
        req.worker_id.clone_from(&worker);
        let (ended, got, _) = match run::execute(g, &args, req, handlers, false).await {
            Ok(done) => done,
            Err(code) => return code,
        };
        let mut o = match ended {
            Some(Ok(o)) => o,
            Some(Err(LaunchError::ImageUnavailable { image, why, .. })) => {
                return refuse(format!(
                    "replay {what}: the attempt's image {image} is gone from this engine ({why}); it was tagged {}: \
                     build or pull it again (a tag that now names another image would not replay the attempt)",
                    action.image.as_deref().unwrap_or("(no tag)")
                ));
            }
            Some(Err(e)) => return refuse(format!("replay {what}: run {i}: {}", stevedore::error_chain(&e))),
            None => return got.unwrap_or(130),
        };
        run::drop_captures(&mut o);
        say_run(i, &o, &action.digest, &out);
        runs.push(o);
        if let Some(code) = got {
            return code;
        }
    }
    let cmp = lib::compare(&runs);
    if cmp.identical {
        println!("outputs: identical in all {} runs", runs.len());
    } else {
        let names: Vec<&str> = cmp.differing.iter().map(String::as_str).collect();
        println!("outputs: differ between runs: {}", names.join(", "));
    }
    if runs.len() > 1 {
        let stats = lib::phase_stats(&runs);
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

/// What will run, on one line, every text escaped.
fn describe(action: &stevedore::contract::Action) -> String {
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
    let caches: Vec<String> = action.caches.iter().map(|(n, path)| format!("{}:{}", p(n), p(path))).collect();
    format!(
        "{task}, {image}, network {}, user {}{}",
        p(&action.network),
        p(&action.user),
        if caches.is_empty() { String::new() } else { format!(", caches {}", caches.join(" ")) }
    )
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
/// (the container rung's network, user and caches; its image by id, never pulled).
fn run_args(
    action: &stevedore::contract::Action,
    rung: &str,
    out: &std::path::Path,
    live: bool,
) -> Result<RunArgs, String> {
    let mut argv: Vec<String> = vec!["replay".into(), "--rung".into(), rung.into()];
    argv.extend(["--output".into(), out.display().to_string()]);
    if !live {
        argv.push("--quiet".into());
    }
    if rung == "container" {
        argv.extend(["--pull".into(), "never".into()]);
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
