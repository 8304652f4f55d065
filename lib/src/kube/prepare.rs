//! Phase 1 of an attempt: everything decided before the cluster is asked for anything (the
//! Pod's name, labels and limits, the argv, the environment layers, the output dir opened,
//! the inputs measured). A request refused here made nothing.

use super::config::KubeConfig;
use super::names;
use super::sizes::Sizes;
use crate::attempt::Decided;
use crate::contract::{InputsStaged, LaunchError, Request, RequestError, Task};
use crate::envlayer;
use crate::inputs::InputDir;
use crate::labels::{AttemptLabels, Owner};
use std::collections::BTreeMap;
use stevedore_init::wire::{HANDLER_MARKER, IN_DIR, INIT_NAME, OUT_DIR, TMP_DIR, TOOLS_DIR, env as wire_env};

/// What the rung decided of one attempt.
#[derive(Debug)]
pub(crate) struct Plan {
    /// What every rung decides (an empty `cwd`: the image's working directory, which the
    /// init takes as its own).
    pub decided: Decided,
    pub image: String,
    pub sizes: Sizes,
    pub inputs: Option<(InputDir, InputsStaged)>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// Where the Pod mounts something (the init checks each is a real directory).
    pub mounts: Vec<String>,
    pub progress: Option<crate::contract::ProgressSink>,
}

pub(crate) fn prepare(cfg: &KubeConfig, incarnation: &str, req: &Request, sizes: Sizes) -> Result<Plan, LaunchError> {
    let started_ms = crate::contract::unix_ms_now();
    let image = match (&req.policy.image, &cfg.image) {
        (i, _) if !i.is_empty() => i.clone(),
        (_, Some(i)) => i.clone(),
        _ => {
            return Err(LaunchError::NotAllowed(
                "the kube rung needs an image (the request names none, and the configuration has no default)".into(),
            ));
        }
    };
    let argv = argv(req, cfg)?;
    let inputs = crate::inputs::opened(req.input_dir.as_deref(), cfg.max_input_bytes)?;
    let output_dir = req.open_output_dir()?;
    let mut decided = Decided::new(started_ms, output_dir, argv, |id| names::pod_name(&req.worker_id, id));
    let env = layer_env(req, cfg);
    decided.env = env.env;
    decided.env_overrides = env.overrides;
    decided.cwd = req.workdir.clone().unwrap_or_default();
    decided.narrowed.clone_from(&sizes.narrowed);
    let owner = Owner { worker: &req.worker_id, incarnation, executor: &cfg.name };
    let l = AttemptLabels::of_request(owner, req, &decided.attempt_id, &cfg.labels);
    let (labels, annotations) = names::of_attempt(&l);
    let mut mounts = vec![TOOLS_DIR.to_owned(), OUT_DIR.to_owned(), TMP_DIR.to_owned()];
    if inputs.is_some() {
        mounts.push(IN_DIR.to_owned());
    }
    Ok(Plan { decided, image, sizes, inputs, labels, annotations, mounts, progress: req.progress.clone() })
}

/// The argv: a plain command as given (Kubernetes' `command`: the API shows no image's
/// `ENTRYPOINT`, so none is put before it; `--entrypoint` still is); a handler through the
/// configured worker entry.
fn argv(req: &Request, cfg: &KubeConfig) -> Result<Vec<String>, LaunchError> {
    match &req.task {
        Task::Command(argv) => {
            let entry = req.entrypoint.clone().unwrap_or_default();
            let all: Vec<String> = entry.into_iter().chain(argv.iter().cloned()).collect();
            if all.first().is_none_or(String::is_empty) {
                return Err(LaunchError::InvalidRequest(RequestError::EmptyCommand));
            }
            Ok(all)
        }
        Task::Handler(_) => {
            let Some(entry) = cfg.worker_entry.clone().filter(|e| !e.is_empty()) else {
                return Err(LaunchError::NotAWorkerImage {
                    image: req.policy.image.clone(),
                    why: "the kube rung cannot read an image's dev.stevedore.entry label through the API; \
                          configure the worker's entry (KubeConfig::worker_entry)"
                        .into(),
                });
            };
            Ok(entry.into_iter().chain([HANDLER_MARKER.to_owned()]).collect())
        }
    }
}

/// Environment: the image's `ENV` (added by the init, below everything) < rung < profile <
/// request < stevedore's protocol variables.
fn layer_env(req: &Request, cfg: &KubeConfig) -> envlayer::Layered {
    let protocol_env = vec![
        (wire_env::JOB_ID.to_owned(), req.job_id.clone()),
        (wire_env::ATTEMPT.to_owned(), req.attempt.to_string()),
        (wire_env::IN.to_owned(), IN_DIR.to_owned()),
        (wire_env::OUT.to_owned(), OUT_DIR.to_owned()),
        (wire_env::INIT.to_owned(), format!("{TOOLS_DIR}/{INIT_NAME}")),
    ];
    envlayer::layer(&[
        ("rung", vec![("HOME".into(), TMP_DIR.into())]),
        ("profile", cfg.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect()),
        ("request", req.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect()),
        ("protocol", protocol_env),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_runs_as_given_and_a_handler_needs_the_worker_entry() {
        let cfg = KubeConfig::default();
        let mut req = Request::command("j", ["sh", "-c", "true"], "/tmp/x");
        req.policy.image = "busybox".into();
        assert_eq!(argv(&req, &cfg).unwrap(), vec!["sh", "-c", "true"]);
        req.entrypoint = Some(vec!["/bin/env".into()]);
        assert_eq!(argv(&req, &cfg).unwrap()[0], "/bin/env");
        let empty = Request::command("j", Vec::<String>::new(), "/tmp/x");
        assert!(matches!(argv(&empty, &cfg), Err(LaunchError::InvalidRequest(RequestError::EmptyCommand))));
        let h = Request::handler("j", "echo", "/tmp/x");
        let err = argv(&h, &cfg).unwrap_err().to_string();
        assert!(err.contains("worker_entry"), "{err}");
        let cfg = KubeConfig::default().worker_entry(vec!["/app/worker".into()]);
        assert_eq!(argv(&h, &cfg).unwrap(), vec!["/app/worker".to_owned(), HANDLER_MARKER.to_owned()]);
    }

    #[test]
    fn the_protocol_variables_win_over_the_request() {
        let mut req = Request::command("j", ["true"], "/tmp/x");
        req.env.insert(wire_env::OUT.into(), "/elsewhere".into());
        req.env.insert("HOME".into(), "/home/me".into());
        let l = layer_env(&req, &KubeConfig::default());
        let env: BTreeMap<_, _> = l.env.into_iter().collect();
        assert_eq!(env[wire_env::OUT], OUT_DIR);
        assert_eq!(env["HOME"], "/home/me");
    }
}
