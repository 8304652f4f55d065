//! The kube rung's part of a takeover (`attempt::recover` does the rest): the Pod is checked
//! to be the checkpoint's (by its UID and labels, never by what the checkpoint says alone),
//! and the init's takeover socket is reached through `stevedore-init relay` run by the API's
//! `exec` in the attempt's container.

use super::cleanup::Cleanup;
use super::error::ClusterError;
use super::ledger::Own;
use super::names;
use super::site::KubeSite;
use super::spec::MAIN;
use crate::attempt::{Ledger, Teardown};
use crate::contract::{Checkpoint, RecoverError, Target};
use crate::labels;
use crate::link::session::Transport;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The longest a takeover waits for the kubelet to report a container it has not reported yet.
const KUBELET_REPORT: std::time::Duration = std::time::Duration::from_secs(15);

/// The checkpoint's Pod, if it is that attempt's and still runs its init; else what is left
/// of the attempt is removed.
pub(crate) async fn reattach(
    site: &Arc<KubeSite>,
    cp: &Checkpoint,
    ledger: &Ledger<Own>,
) -> Result<Cleanup, RecoverError> {
    let Target::Pod { namespace, name, uid } = &cp.target else {
        return Err(RecoverError::Invalid("the checkpoint is not of a Pod".into()));
    };
    if *namespace != site.namespace || *name != ledger.own.pod || *uid != ledger.own.uid {
        return Err(RecoverError::Invalid(format!(
            "the checkpoint's Pod {namespace}/{name} is not this rung's namespace {:?} or not its ledger's",
            site.namespace
        )));
    }
    let cleanup = || {
        let mut c = Cleanup::new(site.clone(), ledger.attempt_id.clone());
        c.pod(name.clone());
        c.made();
        c
    };
    let Some(pod) = site.get_pod(name).await? else {
        return Err(RecoverError::Gone("its Pod no longer exists".into()));
    };
    // The API says what the Pod is: a checkpoint cannot point stevedore at someone else's.
    let meta = &pod.metadata;
    let empty = BTreeMap::new();
    let (l, a) = (meta.labels.as_ref().unwrap_or(&empty), meta.annotations.as_ref().unwrap_or(&empty));
    if meta.uid.as_deref() != Some(uid.as_str())
        || !names::is_of_worker(l, a, &cp.worker)
        || l.get(labels::ATTEMPT_ID) != Some(&ledger.attempt_id)
    {
        return Err(RecoverError::Invalid("the Pod's UID or labels are not this attempt's".into()));
    }
    let cleanup = cleanup();
    let mut end = super::state::main_end(&pod);
    // The attach is made before the API says the container runs (`launch::attached`): a
    // worker that died early may have left a Pod the kubelet has not reported on yet.
    let runs = match super::state::main_runs(&pod) || end.exit_code.is_some() || super::state::finished(&pod) {
        true => super::state::main_runs(&pod),
        false => {
            let reported = super::watch::until(site, name, KUBELET_REPORT, |p| match p {
                Some(p) if super::state::main_runs(p) => super::watch::Look::Done(Some(p.clone())),
                Some(p) if super::state::main_end(p).exit_code.is_none() && !super::state::finished(p) => {
                    super::watch::Look::Wait("the kubelet to report the attempt's container".into())
                }
                other => super::watch::Look::Done(other.cloned()),
            })
            .await;
            match reported {
                Ok(Some(p)) => {
                    end = super::state::main_end(&p);
                    super::state::main_runs(&p)
                }
                _ => false,
            }
        }
    };
    if !runs {
        cleanup.remove().await;
        return Err(RecoverError::Gone(format!(
            "its init ended while no host was there (exit code {:?}); the record went with it",
            end.exit_code
        )));
    }
    Ok(cleanup)
}

/// Runs `argv` in the Pod's attempt's container through the API's `exec`, its streams as
/// the link's transport.
pub(crate) async fn exec(site: &KubeSite, pod: &str, argv: Vec<String>) -> Result<Transport, ClusterError> {
    let ap = super::launch::streams(MAIN, true);
    let what = format!("exec in Pod {pod}");
    let attached = site.call(what, site.pods.exec(pod, argv, &ap)).await.map_err(|e| site.forbidden(e, "pods/exec"))?;
    Ok(super::launch::transport(attached))
}
