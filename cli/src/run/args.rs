//! `run`'s options and the request they make: docker's word order, sizes, the environment,
//! ports.

use crate::common::{self, RungKind};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use stevedore::contract::{Policy, Request, ResourceLimits, limits::key, parse_cpus, parse_duration, parse_size};

const RUN_AFTER_HELP: &str = "\
The container's stdout and stderr go to stevedore's, live. At the end one line on stderr says
what happened; --outcome FILE writes the Outcome JSON there (--outcome - prints it on stdout,
the container's stdout then going to stderr).

Exit status (docs/outcome.md has the table):
  0        ok                     124  timeout          137  oom_killed
  N        the command exited N   126  not executable   128+N  killed by signal N
  101      killed / panicked      127  not found        125  refused, could not launch,
  130/143  interrupted (SIGINT/SIGTERM: the attempt is stopped, grace, then removed)      or lost
  --exit-zero: 0 whenever the attempt ran. A command that itself exits 124, 125 or 137 is
  told apart only by the Outcome.

Examples (docker's word order: the image, then the command):
  stevedore run --input ./in --output ./out --memory 256m --cpus 0.5 --timeout 30s \\
      stevedore-test/busybox:latest sh -c 'wc -c /in/* > /out/sizes.txt'
  stevedore run --image stevedore-test/busybox:latest --output ./out -- cat /etc/hostname | grep .
  stevedore run --network bridge -p 8080 --output ./out IMG httpd -f -p 8080
  stevedore run --handler echo --payload hello --output ./out --outcome outcome.json";

/// Arguments of `stevedore run`.
#[derive(Debug, clap::Args)]
#[command(
    override_usage = "stevedore run [OPTIONS] --output DIR IMAGE [ARGV]...\n       stevedore run [OPTIONS] --output DIR -- ARGV...    (the --image or profile's image)\n       stevedore run [OPTIONS] --output DIR --handler NAME [--payload STR]",
    after_help = RUN_AFTER_HELP
)]
pub struct RunArgs {
    /// Image to run in (default for handlers: stevedore's own worker image)
    #[arg(long, value_name = "IMAGE", help_heading = "Attempt")]
    pub(super) image: Option<String>,
    /// Worker ID (default: a unique one)
    #[arg(long, value_name = "ID", help_heading = "Attempt")]
    pub(super) worker: Option<String>,
    /// Job ID (default: a unique one)
    #[arg(long, value_name = "ID", help_heading = "Attempt")]
    pub(super) job: Option<String>,
    /// Attempt number
    #[arg(long, default_value_t = 1, value_name = "N", help_heading = "Attempt")]
    pub(super) attempt: u32,
    /// Which rung runs the attempt: container, process (a child process under a dedicated
    /// uid when run as root), or kube (a Pod on a Kubernetes cluster; see docs/outcome.md,
    /// "Rungs", and the Kubernetes options)
    /// (default: the profile's `rung`, else container)
    #[arg(long, value_name = "RUNG", value_enum, help_heading = "Attempt")]
    pub(super) rung: Option<RungKind>,
    /// Set an environment variable; VAR alone takes the host's value (repeatable)
    #[arg(long = "env", short = 'e', value_name = "K=V|K", help_heading = "Attempt")]
    pub(super) env: Vec<String>,
    /// Read environment variables from FILE (KEY=VALUE lines, # comments; KEY alone: the host's)
    #[arg(long, value_name = "FILE", help_heading = "Attempt")]
    pub(super) env_file: Vec<PathBuf>,
    /// Working directory in the container
    #[arg(long, short = 'w', value_name = "DIR", help_heading = "Attempt")]
    pub(super) workdir: Option<String>,
    /// User as numeric UID[:GID] (root only if the profile allows it)
    #[arg(long, short = 'u', value_name = "UID[:GID]", help_heading = "Attempt")]
    pub(super) user: Option<String>,
    /// Replace the image's ENTRYPOINT ("" clears it)
    #[arg(long, value_name = "CMD", help_heading = "Attempt")]
    pub(super) entrypoint: Option<String>,
    /// When to pull the image: missing (the default: only when it is not local, and never
    /// when a local image has a close name: that one is named instead), never, always
    #[arg(long, value_name = "WHEN", value_parser = ["missing", "never", "always"], help_heading = "Attempt")]
    pub(super) pull: Option<String>,
    /// Network mode (default: the profile's, else none; only modes the profile allows)
    #[arg(long, value_name = "MODE", help_heading = "Attempt")]
    pub(super) network: Option<String>,
    /// Publish a container port: CONTAINER_PORT or HOST_PORT:CONTAINER_PORT (needs a network)
    #[arg(long = "publish", short = 'p', value_name = "[HOST:]PORT", help_heading = "Attempt")]
    pub(super) publish: Vec<String>,
    /// Mount the named cache NAME at PATH, read-write, kept across runs (repeatable)
    #[arg(long, value_name = "NAME:/PATH", help_heading = "Files")]
    pub(super) cache: Vec<String>,
    /// Directory mounted read-only at /in
    #[arg(long, value_name = "DIR", help_heading = "Files")]
    pub(super) input: Option<PathBuf>,
    /// Named input slot NAME=RELATIVE_PATH (repeatable)
    #[arg(long = "slot", value_name = "NAME=PATH", help_heading = "Files")]
    pub(super) slots: Vec<String>,
    /// Directory that receives /out (created if missing; must be empty)
    #[arg(long, value_name = "DIR", help_heading = "Files")]
    pub(super) output: PathBuf,
    /// Keep the captured stdout and stderr in DIR (default: removed when the run ends)
    #[arg(long, value_name = "DIR", help_heading = "Files")]
    pub(super) logs: Option<PathBuf>,
    /// Memory limit (e.g. 64m, 1g)
    #[arg(long, value_name = "SIZE", help_heading = "Limits (narrowed to the profile's ceilings)")]
    pub(super) memory: Option<String>,
    /// CPU limit in cores (e.g. 0.5)
    #[arg(long, value_name = "N", help_heading = "Limits (narrowed to the profile's ceilings)")]
    pub(super) cpus: Option<String>,
    /// Process limit
    #[arg(long, value_name = "N", help_heading = "Limits (narrowed to the profile's ceilings)")]
    pub(super) pids: Option<u64>,
    /// Disk limit for /out (e.g. 50m)
    #[arg(long, value_name = "SIZE", help_heading = "Limits (narrowed to the profile's ceilings)")]
    pub(super) disk: Option<String>,
    /// The longest the command may run, counted from its start (waiting for a slot, staging
    /// inputs and starting the sandbox do not count), e.g. 10s, 500ms, 2m
    #[arg(long, value_name = "DUR", help_heading = "Limits (narrowed to the profile's ceilings)")]
    pub(super) timeout: Option<String>,
    /// Time between SIGTERM and SIGKILL (default 30s)
    #[arg(long, value_name = "DUR", help_heading = "Limits (narrowed to the profile's ceilings)")]
    pub(super) grace: Option<String>,
    /// What must be enforced, comma-separated (memory, cpu, pids, disk, network, seccomp,
    /// apparmor, non_root, read_only_rootfs, capabilities, no_new_privileges): an attempt
    /// whose rung did not apply one ends launch_failed/not_enforced before its command runs
    #[arg(
        long,
        value_name = "WHAT",
        value_delimiter = ',',
        help_heading = "Limits (narrowed to the profile's ceilings)"
    )]
    pub(super) require_enforced: Vec<String>,
    /// Write the Outcome JSON to FILE (- for stdout); written whenever the attempt ran
    #[arg(long, value_name = "FILE", help_heading = "Output")]
    pub(super) outcome: Option<PathBuf>,
    /// No live output and no summary line
    #[arg(long, short = 'q', help_heading = "Output")]
    pub(super) quiet: bool,
    /// Keep stdin open: this process's stdin becomes the command's (EOF when it ends);
    /// without it the command's stdin is /dev/null
    #[arg(long, short = 'i', help_heading = "Attempt")]
    pub(super) interactive: bool,
    /// A terminal for the command (its stdin, stdout and stderr, of this terminal's size and
    /// following it); with -i this terminal is in raw mode meanwhile, so ^C goes to the command
    #[arg(long, short = 't', help_heading = "Attempt")]
    pub(super) tty: bool,
    /// Exit 0 whenever the attempt ran (refusals still exit 125)
    #[arg(long, help_heading = "Output")]
    pub(super) exit_zero: bool,
    /// Accepted for compatibility: the exit status is the command's by default
    #[arg(long, hide = true)]
    pub(super) exit_status: bool,
    /// Write the attempt's checkpoint to FILE (0600, new) before its command starts, so that
    /// `stevedore recover FILE` can finish it if this process dies
    #[arg(long, value_name = "FILE", help_heading = "Recovery")]
    pub(super) checkpoint: Option<PathBuf>,
    /// How long the attempt keeps running after this process is gone, waiting for
    /// `stevedore recover`, or after its connection to the engine was cut, for this process
    /// to resume it (default 0: it is stopped at once)
    #[arg(long, value_name = "DUR", help_heading = "Recovery")]
    pub(super) host_loss_grace: Option<String>,
    /// Run this handler of the worker image instead of a command
    #[arg(long, value_name = "NAME", conflicts_with = "argv", help_heading = "Handler")]
    pub(super) handler: Option<String>,
    /// Payload for the handler
    #[arg(long, value_name = "STR", conflicts_with = "payload_file", help_heading = "Handler")]
    pub(super) payload: Option<String>,
    /// Payload for the handler, from a file
    #[arg(long, value_name = "FILE", help_heading = "Handler")]
    pub(super) payload_file: Option<PathBuf>,
    /// Expected handler-set fingerprint
    #[arg(long, value_name = "FP", help_heading = "Handler")]
    pub(super) fingerprint: Option<String>,
    /// The key environment values enter the action digest under, HMACed, and the action is
    /// sealed with (its MAC: `replay` with this key trusts it). A private regular file of
    /// yours, 16 bytes at least (default: $STEVEDORE_ACTION_KEY_FILE; without one the values
    /// are left out and nothing is sealed)
    #[arg(long, value_name = "FILE", help_heading = "Output")]
    pub(super) action_key_file: Option<PathBuf>,
    /// Accepted as docker's: every attempt's container is removed anyway
    #[arg(long, help_heading = "Attempt")]
    pub(super) rm: bool,
    /// Refused: stevedore names each attempt's container itself (so `reclaim` finds it); name
    /// the attempt with --job
    #[arg(long, value_name = "NAME", help_heading = "Attempt")]
    pub(super) name: Option<String>,
    /// As docker: IMAGE then the command to run (after the image's ENTRYPOINT); after `--`,
    /// only the command (the image then comes from --image or the profile). A word that starts
    /// with `-` before the first of these is one of stevedore's flags: an unknown one is an
    /// error, never the command
    #[arg(trailing_var_arg = true, value_name = "IMAGE] [ARGV")]
    pub(super) argv: Vec<OsString>,
    /// Whether the words came after `--` (set from the command line by [`RunArgs::see_escape`]).
    #[arg(skip)]
    pub(super) escaped: bool,
}

impl RunArgs {
    /// Notes whether the positional words came after `--` (clap keeps the words, not that): they
    /// are the suffix of the command line `raw`, so the word before them says.
    pub(crate) fn see_escape(&mut self, raw: &[OsString]) {
        let n = self.argv.len();
        self.escaped = n > 0 && raw.len() > n && raw[raw.len() - n - 1] == "--";
    }
}

/// The image and the command the positional words give, in docker's word order: the first
/// word before `--` is the image and the words after it (or after `--`) the command; words
/// after `--` alone are the command of the `--image` or configured image. `None`: no image
/// given by a word.
fn image_and_command(
    words: Vec<String>,
    escaped: bool,
    image_flag: Option<&str>,
    handler: bool,
) -> Result<(Option<String>, Vec<String>), String> {
    if words.is_empty() || escaped {
        if handler && !words.is_empty() {
            return Err("give either --handler or a command, not both".into());
        }
        return Ok((None, words));
    }
    let image = &words[0];
    if handler {
        return Err(format!(
            "--handler runs a handler of the worker image and takes no image word ({image:?}); name another worker \
             image with --image"
        ));
    }
    if let Some(flag) = image_flag {
        return Err(format!(
            "two images: --image {flag} and {image:?} (the first word before `--` is the image, as with docker run); \
             write `stevedore run [OPTIONS] IMAGE [CMD]...` or `stevedore run [OPTIONS] --image IMAGE -- CMD...`"
        ));
    }
    let mut rest = words[1..].to_vec();
    if rest.first().is_some_and(|w| w == "--") {
        rest.remove(0);
    }
    Ok((Some(image.clone()), rest))
}

/// A size option, with a hint when a bare number was meant with a unit.
pub(super) fn size_arg(flag: &str, v: &str, floor: u64) -> Result<u64, String> {
    let n = parse_size(v).map_err(|e| format!("--{flag}: {e}"))?;
    if n < floor && v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("--{flag} {v} is {n} bytes: did you mean {v}m?"));
    }
    Ok(n)
}

/// `K=V` as is; `K` alone takes the host's value, and is skipped when the host has none (as
/// `docker run -e K` does).
pub(crate) fn env_pair(kv: &str, what: &str) -> Result<Option<(String, String)>, String> {
    match kv.split_once('=') {
        Some(("", _)) => Err(format!("invalid {what} {kv:?}: the name is empty")),
        Some((k, v)) => Ok(Some((k.to_owned(), v.to_owned()))),
        None if kv.is_empty() => Err(format!("invalid {what}: empty")),
        None => Ok(std::env::var(kv).ok().map(|v| (kv.to_owned(), v))),
    }
}

pub(crate) fn env_file(path: &Path) -> Result<Vec<(String, String)>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("--env-file {}: {e}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim_start();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let what = format!("line {} of {}", i + 1, path.display());
        let name = line.split_once('=').map_or(line, |(k, _)| k);
        if name.contains(char::is_whitespace) {
            // As docker: `export Z=3` would set a variable named "export Z".
            return Err(format!(
                "invalid variable name {name:?} on {what}: a name has no whitespace (write Z=3, not export Z=3)"
            ));
        }
        out.extend(env_pair(line, &what)?);
    }
    Ok(out)
}

/// `[127.0.0.1:][HOST_PORT:]CONTAINER_PORT[/tcp]` → (container port, host port; 0: any).
pub(crate) fn publish_arg(s: &str) -> Result<(u16, u16), String> {
    let bad = || format!("-p {s:?}: expected CONTAINER_PORT or HOST_PORT:CONTAINER_PORT (tcp)");
    let s2 = s.strip_suffix("/tcp").unwrap_or(s);
    if s2.ends_with("/udp") {
        return Err(format!("-p {s:?}: only tcp ports can be published"));
    }
    let parts: Vec<&str> = s2.split(':').collect();
    let port = |p: &str| p.parse::<u16>().ok().filter(|n| *n > 0).ok_or_else(bad);
    match parts.as_slice() {
        [c] => Ok((port(c)?, 0)),
        [h, c] => Ok((port(c)?, port(h)?)),
        ["127.0.0.1" | "localhost", h, c] => Ok((port(c)?, port(h)?)),
        [ip, _, _] => Err(format!("-p {s:?}: ports are published on the engine host's loopback only, not {ip}")),
        _ => Err(bad()),
    }
}

fn argv_strings(argv: &[OsString]) -> Result<Vec<String>, String> {
    argv.iter()
        .enumerate()
        .map(|(i, arg)| {
            arg.to_str()
                .map(str::to_owned)
                .ok_or_else(|| format!("argument {i} of the command ({}) is not valid UTF-8", arg.to_string_lossy()))
        })
        .collect()
}

pub(super) fn request(a: &RunArgs) -> Result<Request, String> {
    if let Some(name) = &a.name {
        return Err(format!(
            "--name {name:?}: stevedore names each attempt's container itself, so that reclaim finds what a \
             crash left; name the attempt with --job"
        ));
    }
    let job = a.job.clone().unwrap_or_else(|| format!("run-{:08x}", rand::random::<u32>()));
    let (word_image, argv) =
        image_and_command(argv_strings(&a.argv)?, a.escaped, a.image.as_deref(), a.handler.is_some())?;
    let mut req = match (&a.handler, argv.is_empty()) {
        (Some(h), true) => Request::handler(job, h.clone(), a.output.clone()),
        (None, _) => Request::command(job, argv, a.output.clone()),
        (Some(_), false) => return Err("give either --handler or a command, not both".into()),
    };
    req.attempt = a.attempt;
    req.worker_id = a.worker.clone().unwrap_or_else(common::mint_worker);
    if let Some(p) = &a.payload {
        req.payload = p.clone().into_bytes();
    }
    if let Some(f) = &a.payload_file {
        req.payload = common::read_payload(f)?;
    }
    req.input_dir = a.input.clone();
    for s in &a.slots {
        let (k, v) = s.split_once('=').ok_or_else(|| format!("invalid --slot {s:?}: expected NAME=PATH"))?;
        req.inputs.insert(k.to_owned(), PathBuf::from(v));
    }
    let mut limits = ResourceLimits::new();
    if let Some(m) = &a.memory {
        limits = limits.with(key::MEMORY, size_arg("memory", m, 6 << 20)?);
    }
    if let Some(c) = &a.cpus {
        limits = limits.with(key::CPU, parse_cpus(c).map_err(|e| format!("--cpus: {e}"))?);
    }
    if let Some(p) = a.pids {
        limits = limits.with(key::PIDS, p);
    }
    if let Some(d) = &a.disk {
        limits = limits.with(key::DISK, size_arg("disk", d, 1 << 20)?);
    }
    req.limits = limits;
    let mut policy = Policy::default();
    if let Some(g) = &a.grace {
        policy = policy.with_grace(parse_duration(g).map_err(|e| format!("--grace: {e}"))?);
    }
    if let Some(img) = a.image.as_ref().or(word_image.as_ref()) {
        policy.image = img.clone();
    }
    policy.require_enforced = a.require_enforced.clone();
    req.policy = policy;
    if let Some(t) = &a.timeout {
        req = req.timeout(parse_duration(t).map_err(|e| format!("--timeout: {e}"))?);
    }
    for f in &a.env_file {
        req.env.extend(env_file(f)?);
    }
    for kv in &a.env {
        req.env.extend(env_pair(kv, "--env")?);
    }
    req.workdir = a.workdir.clone();
    req.entrypoint = a.entrypoint.as_ref().map(|e| if e.is_empty() { Vec::new() } else { vec![e.clone()] });
    req.fingerprint = a.fingerprint.clone();
    req.action_key = action_key(a.action_key_file.as_deref())?;
    req.validate().map_err(|e| format!("invalid request: {e}"))?;
    Ok(req)
}

/// The action key in `file`, else in the file `$STEVEDORE_ACTION_KEY_FILE` names; `None`
/// without either.
pub(crate) fn action_key(file: Option<&Path>) -> Result<Option<stevedore::contract::ActionKey>, String> {
    use stevedore::contract::ActionKey;
    let key = match file {
        Some(f) => ActionKey::from_file(f).map(Some),
        None => ActionKey::from_env(),
    };
    key.map_err(|e| stevedore::error_chain(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, clap::Parser)]
    struct Run {
        #[command(flatten)]
        run: RunArgs,
    }

    /// `stevedore run WORDS…` as the command line parses it: (image, command) or the error.
    fn words(line: &[&str]) -> Result<(Option<String>, Vec<String>), String> {
        use clap::Parser;
        let raw: Vec<OsString> = std::iter::once("run").chain(line.iter().copied()).map(OsString::from).collect();
        let mut a = Run::try_parse_from(&raw).map_err(|e| e.to_string())?.run;
        a.see_escape(&raw);
        let req = request(&a)?;
        let cmd = match &req.task {
            stevedore::contract::Task::Command(argv) => argv.clone(),
            stevedore::contract::Task::Handler(h) => vec![format!("handler {h}")],
        };
        Ok((Some(req.policy.image.clone()).filter(|i| !i.is_empty()), cmd))
    }

    fn v(ws: &[&str]) -> Vec<String> {
        ws.iter().map(|w| (*w).to_owned()).collect()
    }

    /// `-w` where the rung has no root to make it in is refused, named (issue 49).
    #[test]
    fn the_process_rung_refuses_a_working_dir() {
        use clap::Parser;
        use common::Adjust;
        let a = Run::try_parse_from(["run", "-w", "/w", "--output", "o", "--", "true"]).unwrap().run;
        let err = a.process(&mut stevedore::process::ProcessConfig::default()).unwrap_err();
        assert!(err.starts_with("-w /w is not available on the process rung"), "{err}");
        let plain = Run::try_parse_from(["run", "--output", "o", "--", "true"]).unwrap().run;
        assert!(plain.process(&mut stevedore::process::ProcessConfig::default()).is_ok());
    }

    /// docker's word order (issue 49): the first word before `--` is the image, the rest (or
    /// what follows `--`) the command; `-- CMD` alone keeps the --image or configured image.
    #[test]
    fn the_image_then_the_command_as_docker_run() {
        let img = Some("busybox".to_owned());
        assert_eq!(
            words(&["--output", "o", "busybox", "sh", "-c", "echo $0", "-x"]).unwrap(),
            (img.clone(), v(&["sh", "-c", "echo $0", "-x"]))
        );
        assert_eq!(
            words(&["--output", "o", "busybox", "--", "sh", "-c", "x"]).unwrap(),
            (img.clone(), v(&["sh", "-c", "x"]))
        );
        assert_eq!(
            words(&["--output", "o", "busybox", "echo", "--", "x"]).unwrap(),
            (img.clone(), v(&["echo", "--", "x"])),
            "after the command's first word, `--` is the command's"
        );
        assert_eq!(
            words(&["--output", "o", "--image", "busybox", "--", "sh", "-c", "x"]).unwrap(),
            (img.clone(), v(&["sh", "-c", "x"]))
        );
        assert_eq!(
            words(&["--output", "o", "--", "sh", "-c", "x"]).unwrap(),
            (None, v(&["sh", "-c", "x"])),
            "the configured image"
        );
        assert_eq!(words(&["--output", "o", "-e", "A=1", "busybox", "true"]).unwrap(), (img.clone(), v(&["true"])));
        let twice = words(&["--output", "o", "--image", "alpine", "busybox", "true"]).unwrap_err();
        assert!(twice.contains("two images: --image alpine and \"busybox\""), "{twice}");
        let twice = words(&["--output", "o", "--image", "alpine", "busybox", "--", "true"]).unwrap_err();
        assert!(twice.contains("two images"), "{twice}");
        assert_eq!(words(&["--output", "o", "--handler", "echo"]).unwrap(), (None, v(&["handler echo"])));
        assert!(
            words(&["--output", "o", "--handler", "echo", "busybox"]).is_err(),
            "no positional image with --handler"
        );
        assert!(words(&["--output", "o", "--handler", "echo", "--", "true"]).is_err());
        let typo = words(&["--output", "o", "--memroy", "1g", "busybox", "true"]).unwrap_err();
        assert!(typo.contains("--memory"), "a flag before the image is a flag: {typo}");
    }

    #[test]
    fn publish_forms() {
        assert_eq!(publish_arg("8080"), Ok((8080, 0)));
        assert_eq!(publish_arg("9000:8080"), Ok((8080, 9000)));
        assert_eq!(publish_arg("127.0.0.1:9000:8080/tcp"), Ok((8080, 9000)));
        assert!(publish_arg("8080/udp").unwrap_err().contains("tcp"));
        assert!(publish_arg("0.0.0.0:9000:8080").unwrap_err().contains("loopback"));
        assert!(publish_arg("x").is_err());
        assert!(publish_arg("0").is_err());
    }

    #[test]
    fn env_from_the_host_and_files() {
        // SAFETY-free: the test reads an env var every test process has.
        let path = std::env::var("PATH").unwrap();
        assert_eq!(env_pair("PATH", "-e").unwrap(), Some(("PATH".into(), path)));
        assert_eq!(env_pair("A=b=c", "-e").unwrap(), Some(("A".into(), "b=c".into())));
        assert_eq!(env_pair("STEVEDORE_SURELY_UNSET_VAR", "-e").unwrap(), None, "unset on the host: skipped");
        assert!(env_pair("=x", "-e").is_err());
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("env");
        std::fs::write(&f, "# comment\nA=1\n\n  B=two words\nPATH\n").unwrap();
        let got = env_file(&f).unwrap();
        assert_eq!(got[0], ("A".into(), "1".into()));
        assert_eq!(got[1], ("B".into(), "two words".into()));
        assert_eq!(got[2].0, "PATH");
        std::fs::write(&f, "=oops\n").unwrap();
        assert!(env_file(&f).unwrap_err().contains("line 1"));
        // A name with whitespace is refused, the file and line named, as docker does.
        std::fs::write(&f, "A=1\nexport Z=3\n").unwrap();
        let err = env_file(&f).unwrap_err();
        assert!(err.contains(&format!("line 2 of {}", f.display())) && err.contains("\"export Z\""), "{err}");
        std::fs::write(&f, "Z =3\n").unwrap();
        assert!(env_file(&f).unwrap_err().contains("line 1"));
        std::fs::write(&f, "Z=a b\n").unwrap();
        assert_eq!(env_file(&f).unwrap(), vec![("Z".into(), "a b".into())], "a value may have spaces");
    }

    #[test]
    fn a_bare_number_gets_a_hint() {
        assert_eq!(size_arg("memory", "64", 6 << 20).unwrap_err(), "--memory 64 is 64 bytes: did you mean 64m?");
        assert_eq!(size_arg("memory", "64m", 6 << 20).unwrap(), 64 << 20);
    }
}
