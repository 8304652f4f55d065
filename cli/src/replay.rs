//! `stevedore replay OUTCOME.json`: the attempt again, as its action says (`docs/outcome.md`,
//! "Replay"), `-n` times; each run's status and output digests, whether they are the
//! attempt's, whether the runs' outputs were identical (a cheap test for non-determinism),
//! where a differing file first differs, and the phases' spread.

use crate::common::{Global, RungKind};
use crate::error::CliError;
use crate::page::shell_word;
use crate::run::{self, RunArgs};
use clap::Parser;
use std::path::{Path, PathBuf};
use stevedore::contract::{LaunchError, Outcome, OutputFile};
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

After the runs: first whether each run's outputs equal the attempt's (the Outcome's digests),
then whether the runs agree with each other; for a file that differs, its sizes, the first
differing byte of the kept copies and the cmp command that shows it; the phases in ms; where
the runs' outputs are kept and the command that removes them.

Exit status: 0 every run ok and all outputs equal the attempt's (unless --inputs replaced
them) and each other's, 1 outputs differed, 2 a run was not ok (outputs identical or not),
125 refused (the reason on stderr).")]
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
    /// The attempt's output dir, when it is still there: a file that differs from the
    /// attempt's is compared byte by byte with it (the Outcome holds only digests and sizes)
    #[arg(long, value_name = "DIR")]
    attempt_output: Option<PathBuf>,
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
    let kept = Kept { base: &base, made: a.output.is_none() };
    Ok(conclude(&outcome, &runs, &kept, a.attempt_output.as_deref(), plan.inputs_replaced.is_some()))
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

/// Where the runs' outputs are kept and whether this command made the directory (then the
/// whole of it is the runs'; a directory given with `--output` may hold more).
struct Kept<'a> {
    base: &'a Path,
    made: bool,
}

/// First whether each run's outputs equal the attempt's, then whether the runs agree, the
/// phases in words, where the outputs are kept and how to remove them; the exit status. On
/// inputs that `--inputs` replaced, outputs other than the attempt's are expected: said, and
/// not a failure.
fn conclude(
    recorded: &Outcome,
    runs: &[Outcome],
    kept: &Kept<'_>,
    attempt_dir: Option<&Path>,
    inputs_replaced: bool,
) -> u8 {
    let mut against = against_attempt(recorded, runs, kept.base, attempt_dir);
    if inputs_replaced && !against.equal {
        against.lines.push("  (the inputs were replaced: outputs other than the attempt's are expected)".into());
        against.equal = true;
    }
    let between = between_runs(runs, kept.base);
    for line in against.lines.iter().chain(&between.lines) {
        println!("{line}");
    }
    println!("{}", phases_line(runs));
    println!("{}", removal_line(runs.len(), kept));
    if runs.iter().any(|o| o.status != stevedore::contract::Status::Ok) {
        2
    } else if !(against.equal && between.equal) {
        1
    } else {
        0
    }
}

/// Lines said about a comparison, and whether it found the outputs equal.
struct Said {
    equal: bool,
    lines: Vec<String>,
}

/// Whether each run's outputs are the attempt's (the Outcome's names and digests); for a file
/// that differs, both sizes, and with the attempt's outputs at hand (`--attempt-output`) the
/// first differing byte and the command that shows it.
fn against_attempt(recorded: &Outcome, runs: &[Outcome], base: &Path, attempt_dir: Option<&Path>) -> Said {
    let p = stevedore_init::wire::printable;
    let then: std::collections::BTreeMap<&str, &OutputFile> =
        recorded.outputs.iter().map(|f| (f.name.as_str(), f)).collect();
    let files = plural(then.len(), "file");
    let verdicts: Vec<lib::Comparison> = runs.iter().map(|o| lib::compare(&[recorded.clone(), o.clone()])).collect();
    if verdicts.iter().all(|c| c.identical) {
        let all = if runs.len() == 1 { "the run's".to_owned() } else { format!("all {} runs'", runs.len()) };
        let line = format!("against the attempt: {all} outputs equal the attempt's ({files}, by digest)");
        return Said { equal: true, lines: vec![line] };
    }
    let mut lines = Vec::new();
    for (i, (o, cmp)) in runs.iter().zip(&verdicts).enumerate() {
        let run = i + 1;
        if cmp.identical {
            lines.push(format!("against the attempt: run {run}'s outputs equal the attempt's"));
            continue;
        }
        let names: Vec<String> = cmp.differing.iter().map(|n| p(n)).collect();
        lines.push(format!("against the attempt: run {run}'s outputs differ from the attempt's: {}", names.join(", ")));
        let now: std::collections::BTreeMap<&str, &OutputFile> =
            o.outputs.iter().map(|f| (f.name.as_str(), f)).collect();
        for name in &cmp.differing {
            let (was, is) = (then.get(name.as_str()).copied(), now.get(name.as_str()).copied());
            let mut line = format!("  {}: the attempt's {}, run {run}'s {}", p(name), size_of(was), size_of(is));
            // Bytes to compare only where both have the file (else the sizes say it all).
            if was.is_some() && is.is_some() {
                let ours = beneath(&base.join(format!("run-{run}")), name);
                match (attempt_dir.map(|d| beneath(d, name)), ours) {
                    (Some(Some(theirs)), Some(ours)) => line.push_str(&differ_at(&theirs, &ours)),
                    (None, _) => line.push_str(
                        " (the outcome holds digests, not bytes: give --attempt-output DIR, the attempt's output \
                         dir, for the first differing byte)",
                    ),
                    _ => {}
                }
            }
            lines.push(line);
        }
    }
    Said { equal: false, lines }
}

/// Whether the runs' outputs agree; for a file that differs, its sizes in the first run and in
/// the first run whose copy is another, the first differing byte and the command that shows it.
fn between_runs(runs: &[Outcome], base: &Path) -> Said {
    let p = stevedore_init::wire::printable;
    if runs.len() < 2 {
        return Said {
            equal: true,
            lines: vec!["between the runs: one run, nothing to compare (-n N runs it N times)".into()],
        };
    }
    let cmp = lib::compare(runs);
    if cmp.identical {
        return Said { equal: true, lines: vec![format!("between the runs: identical in all {} runs", runs.len())] };
    }
    let names: Vec<String> = cmp.differing.iter().map(|n| p(n)).collect();
    let mut lines = vec![format!("between the runs: outputs differ: {}", names.join(", "))];
    let find = |o: &Outcome, name: &str| o.outputs.iter().find(|f| f.name == name).map(|f| f.hash.clone());
    for name in &cmp.differing {
        let first = find(&runs[0], name);
        // The first run whose file is another than run 1's: the pair a person compares.
        let Some(k) = runs.iter().position(|o| find(o, name) != first) else { continue };
        let (a, b) = (1, k + 1);
        let file = |r: usize| runs[r - 1].outputs.iter().find(|f| f.name == *name);
        let mut line = format!("  {}: run {a}'s {}, run {b}'s {}", p(name), size_of(file(a)), size_of(file(b)));
        let copy = |r: usize| file(r).and_then(|_| beneath(&base.join(format!("run-{r}")), name));
        if let (Some(x), Some(y)) = (copy(a), copy(b)) {
            line.push_str(&differ_at(&x, &y));
        }
        lines.push(line);
    }
    Said { equal: false, lines }
}

/// A file's size as said, or that it is absent.
fn size_of(f: Option<&OutputFile>) -> String {
    f.map_or_else(|| "is absent".to_owned(), |f| plural(usize::try_from(f.size).unwrap_or(usize::MAX), "byte"))
}

/// `n` things, the word in the plural unless one.
fn plural(n: usize, word: &str) -> String {
    format!("{n} {word}{}", if n == 1 { "" } else { "s" })
}

/// `name` (an output's name, relative) beneath `dir`; `None` for a name that would leave it:
/// the attempt's names come from a file anyone can write.
fn beneath(dir: &Path, name: &str) -> Option<PathBuf> {
    let rel = Path::new(name);
    rel.components().all(|c| matches!(c, std::path::Component::Normal(_))).then(|| dir.join(rel))
}

/// Where the two kept copies first differ, and the command that shows it, as said after a
/// file's sizes.
fn differ_at(a: &Path, b: &Path) -> String {
    match first_difference(a, b) {
        Ok(Some(at)) => format!(
            ", first differing byte at offset {at}: cmp -- {} {}",
            shell_word(&a.display().to_string()),
            shell_word(&b.display().to_string())
        ),
        Ok(None) => ", the kept copies are the same bytes (one changed after it was hashed?)".to_owned(),
        Err(e) => format!(", the kept copies could not be compared: {e}"),
    }
}

/// The offset of the first byte where the files at `a` and `b` differ (the shorter one's
/// length when it is the other's beginning), or `None` when they are the same bytes.
fn first_difference(a: &Path, b: &Path) -> std::io::Result<Option<u64>> {
    use std::io::Read;
    let open = |p: &Path| std::fs::File::open(p).map(std::io::BufReader::new);
    let (mut x, mut y) = (open(a)?, open(b)?);
    let (mut bx, mut by) = (vec![0u8; 64 << 10], vec![0u8; 64 << 10]);
    let mut at: u64 = 0;
    loop {
        let nx = read_full(&mut x, &mut bx)?;
        let ny = read_full(&mut y, &mut by)?;
        let n = nx.min(ny);
        if let Some(i) = bx[..n].iter().zip(&by[..n]).position(|(p, q)| p != q) {
            return Ok(Some(at + i as u64));
        }
        if nx != ny {
            return Ok(Some(at + n as u64));
        }
        if nx == 0 {
            return Ok(None);
        }
        at += n as u64;
    }

    /// Fills `buf` as far as the file goes (a short read is not its end).
    fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
        let mut got = 0;
        while got < buf.len() {
            match r.read(&mut buf[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(got)
    }
}

/// The span that ends at each phase (`docs/outcome.md`, "phases"), in words a person reads.
const PHASE_WORDS: [(&str, &str); 8] = [
    ("prepared_ms", "prepare"),
    ("inputs_staged_ms", "stage the inputs"),
    ("created_ms", "make the sandbox"),
    ("started_ms", "start it"),
    ("command_started_ms", "start the command"),
    ("command_ended_ms", "command ran"),
    ("outputs_collected_ms", "collect the outputs"),
    ("concluded_ms", "remove the sandbox and conclude"),
];

/// Each phase's span in one run, in ms, by its words: the phases are offsets from when the
/// rung took the attempt, and a span runs from the last phase reached before it. The total last.
fn spans(o: &Outcome) -> Vec<(&'static str, u64)> {
    let at = serde_json::to_value(&o.evidence.phases).unwrap_or_default();
    let mut prev = 0;
    let mut out = Vec::new();
    for (key, words) in PHASE_WORDS {
        if let Some(ms) = at.get(key).and_then(serde_json::Value::as_u64) {
            out.push((words, ms.saturating_sub(prev)));
            prev = ms;
        }
    }
    if !out.is_empty() {
        out.push(("total", prev));
    }
    out
}

/// The phases in words and milliseconds: one run's as they were, several runs' as mean ±
/// standard deviation (of the population) over the runs that reached each.
fn phases_line(runs: &[Outcome]) -> String {
    let per_run: Vec<Vec<(&str, u64)>> = runs.iter().map(spans).collect();
    let mut order: Vec<&str> = Vec::new();
    let mut seen: std::collections::HashMap<&str, Vec<f64>> = std::collections::HashMap::new();
    for (words, ms) in per_run.iter().flatten() {
        if !order.contains(words) {
            order.push(words);
        }
        seen.entry(words).or_default().push(*ms as f64);
    }
    // "total" last, whichever run first reached which phase.
    order.sort_by_key(|w| *w == "total");
    if order.is_empty() {
        return "phases: none timed".to_owned();
    }
    let one = runs.len() == 1;
    let parts: Vec<String> = order
        .iter()
        .map(|w| {
            let xs = &seen[w];
            let n = xs.len() as f64;
            let mean = xs.iter().sum::<f64>() / n;
            if one {
                format!("{w} {mean:.0} ms")
            } else {
                let sd = (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt();
                format!("{w} {mean:.1} ± {sd:.1} ms")
            }
        })
        .collect();
    if one {
        format!("phases: {}", parts.join(", "))
    } else {
        format!("phases (mean ± stddev over {} runs): {}", runs.len(), parts.join(", "))
    }
}

/// Where the runs' outputs are kept and the command that removes them: the whole directory
/// when this command made it, else only the runs' own (a directory given may hold more).
fn removal_line(n: usize, kept: &Kept<'_>) -> String {
    let base = shell_word(&kept.base.display().to_string());
    if kept.made {
        format!("the runs' outputs are kept in {base}/run-1 … run-{n}; remove them with: rm -rf -- {base}")
    } else {
        let dirs: Vec<String> =
            (1..=n).map(|i| shell_word(&kept.base.join(format!("run-{i}")).display().to_string())).collect();
        format!("the runs' outputs are kept in {base}/run-1 … run-{n}; remove them with: rm -rf -- {}", dirs.join(" "))
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
        RungKind::Oci => {
            let cfg = stevedore::oci::OciConfig::default();
            Ok((cfg.default_limits(), cfg.max_input_bytes))
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use stevedore::contract::Status;

    fn file(name: &str, bytes: &[u8]) -> OutputFile {
        // The digest stands for the bytes: equal bytes, equal digest.
        let hash = format!("sha256:{}", String::from_utf8_lossy(bytes));
        OutputFile { name: name.into(), size: bytes.len() as u64, hash, content_type: String::new() }
    }

    /// A run's Outcome and its kept copies in `base/run-<i>`.
    fn run(base: &Path, i: usize, files: &[(&str, &[u8])]) -> Outcome {
        let dir = base.join(format!("run-{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        let mut o = Outcome::new(Status::Ok);
        for (name, bytes) in files {
            std::fs::write(dir.join(name), bytes).unwrap();
            o.outputs.push(file(name, bytes));
        }
        o
    }

    #[test]
    fn the_first_differing_byte_is_found_past_a_buffer_and_at_a_prefix() {
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        let mut x = vec![7u8; 200_000];
        std::fs::write(&a, &x).unwrap();
        std::fs::write(&b, &x).unwrap();
        assert_eq!(first_difference(&a, &b).unwrap(), None);
        x[150_001] = 8;
        std::fs::write(&b, &x).unwrap();
        assert_eq!(first_difference(&a, &b).unwrap(), Some(150_001), "in the third buffer");
        std::fs::write(&b, &x[..1000]).unwrap();
        assert_eq!(first_difference(&a, &b).unwrap(), Some(1000), "the shorter one's end");
        assert!(first_difference(&a, &t.path().join("gone")).is_err());
    }

    #[test]
    fn each_run_is_said_against_the_attempt_first_then_against_the_others() {
        let t = tempfile::tempdir().unwrap();
        let base = t.path().join("r");
        let attempt = t.path().join("attempt");
        std::fs::create_dir(&attempt).unwrap();
        std::fs::write(attempt.join("t"), b"100\n").unwrap();
        let mut recorded = Outcome::new(Status::Ok);
        recorded.outputs = vec![file("t", b"100\n"), file("y", b"same")];
        let runs =
            [run(&base, 1, &[("t", b"100\n"), ("y", b"same")]), run(&base, 2, &[("t", b"1050\n"), ("y", b"same")])];
        let against = against_attempt(&recorded, &runs, &base, Some(&attempt));
        assert!(!against.equal);
        let run2 = base.join("run-2/t");
        assert_eq!(
            against.lines,
            [
                "against the attempt: run 1's outputs equal the attempt's".to_owned(),
                "against the attempt: run 2's outputs differ from the attempt's: t".to_owned(),
                format!(
                    "  t: the attempt's 4 bytes, run 2's 5 bytes, first differing byte at offset 2: cmp -- {} {}",
                    attempt.join("t").display(),
                    run2.display()
                ),
            ]
        );
        // Without the attempt's copies the sizes are said, and how to get the offset.
        let blind = against_attempt(&recorded, &runs, &base, None);
        assert!(blind.lines[2].contains("give --attempt-output DIR"), "{:?}", blind.lines);
        let between = between_runs(&runs, &base);
        assert!(!between.equal);
        assert_eq!(
            between.lines,
            [
                "between the runs: outputs differ: t".to_owned(),
                format!(
                    "  t: run 1's 4 bytes, run 2's 5 bytes, first differing byte at offset 2: cmp -- {} {}",
                    base.join("run-1/t").display(),
                    run2.display()
                ),
            ]
        );
        // All equal: one line each.
        let same = [runs[0].clone(), runs[0].clone()];
        let against = against_attempt(&recorded, &same, &base, None);
        assert!(against.equal);
        assert_eq!(
            against.lines,
            ["against the attempt: all 2 runs' outputs equal the attempt's (2 files, by digest)"]
        );
        assert_eq!(between_runs(&same, &base).lines, ["between the runs: identical in all 2 runs"]);
        // A file a run lacks is said absent, with no bytes to compare.
        let lacking = [run(&base, 3, &[("y", b"same")])];
        let said = against_attempt(&recorded, &lacking, &base, Some(&attempt)).lines;
        assert_eq!(said[1], "  t: the attempt's 4 bytes, run 1's is absent");
        // A name that would leave the dir is not followed.
        assert_eq!(beneath(&base, "../x"), None);
        assert_eq!(beneath(&base, "a/b"), Some(base.join("a/b")));
    }

    #[test]
    fn the_phases_are_spans_in_words_and_ms() {
        let mut a = Outcome::new(Status::Ok);
        let p = &mut a.evidence.phases;
        (p.prepared_ms, p.created_ms, p.command_started_ms, p.command_ended_ms) =
            (Some(3), Some(10), Some(12), Some(24));
        assert_eq!(
            phases_line(std::slice::from_ref(&a)),
            "phases: prepare 3 ms, make the sandbox 7 ms, start the command 2 ms, command ran 12 ms, total 24 ms"
        );
        let mut b = a.clone();
        b.evidence.phases.command_ended_ms = Some(28);
        let line = phases_line(&[a, b]);
        assert!(line.starts_with("phases (mean ± stddev over 2 runs): prepare 3.0 ± 0.0 ms,"), "{line}");
        assert!(line.contains("command ran 14.0 ± 2.0 ms, total 26.0 ± 2.0 ms"), "{line}");
        assert_eq!(phases_line(&[Outcome::new(Status::Ok)]), "phases: none timed");
    }

    #[test]
    fn the_removal_command_removes_what_the_runs_made_and_no_more() {
        let made = Kept { base: Path::new("/tmp/stevedore-replay-x"), made: true };
        assert_eq!(
            removal_line(2, &made),
            "the runs' outputs are kept in /tmp/stevedore-replay-x/run-1 … run-2; remove them with: rm -rf -- \
             /tmp/stevedore-replay-x"
        );
        let given = Kept { base: Path::new("/home/me/it's here"), made: false };
        assert!(
            removal_line(2, &given).ends_with(r"rm -rf -- '/home/me/it'\''s here/run-1' '/home/me/it'\''s here/run-2'"),
            "{}",
            removal_line(2, &given)
        );
    }
}
