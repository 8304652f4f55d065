//! The container rung's part of a takeover (`attempt::recover` does the rest): the
//! container is checked to be the checkpoint's (by the engine's labels, never by what the
//! checkpoint says), the init's takeover socket is reached through `stevedore-init relay`
//! run by the engine's exec (the dead process's tools volume goes with its last attempt:
//! `Launch::recovered`).

use super::cleanup::Cleanup;
use super::labels;
use super::ledger::Own;
use super::site::ContainerSite;
use crate::attempt::{Ledger, Teardown};
use crate::contract::{Checkpoint, RecoverError, Target};
use crate::link::session::Transport;
use std::sync::Arc;
use std::time::Duration;

/// The checkpoint's container, if it is that attempt's and still runs its init; else what
/// is left of the attempt is removed.
pub(crate) async fn reattach(
    site: &Arc<ContainerSite>,
    cp: &Checkpoint,
    ledger: &Ledger<Own>,
) -> Result<Cleanup, RecoverError> {
    let Target::Container { id, .. } = &cp.target else {
        return Err(RecoverError::Invalid("the checkpoint is not of a container".into()));
    };
    let cleanup = || {
        let mut c = Cleanup::new(site.clone(), ledger.attempt_id.clone(), &cp.worker);
        c.left.containers = ledger.own.containers.clone();
        c.left.volumes = ledger.own.volumes.clone();
        c.left.record();
        c
    };
    // The engine says what the container is: a checkpoint cannot point stevedore at
    // someone else's container.
    let state = match site.engine.api.inspect_container(id).await {
        Ok(s) => s,
        Err(e) if e.is_not_found() => {
            cleanup().remove().await;
            return Err(RecoverError::Gone("its container no longer exists".into()));
        }
        Err(e) => return Err(RecoverError::Engine(e)),
    };
    let label = |k: &str| state.labels.get(k).map(String::as_str);
    if label(labels::WORKER) != Some(&cp.worker)
        || label(labels::ATTEMPT_ID) != Some(&ledger.attempt_id)
        || *id != ledger.own.container_id
    {
        return Err(RecoverError::Invalid("the container's labels are not this attempt's".into()));
    }
    let cleanup = cleanup();
    if !state.running {
        cleanup.remove().await;
        return Err(RecoverError::Gone(format!(
            "its init ended while no host was there (exit code {:?}); the record went with it",
            state.exit_code
        )));
    }
    Ok(cleanup)
}

/// The init's takeover socket, through `stevedore-init relay` in the container. The relay
/// runs as root when the command does not: the init then takes a takeover only from uid 0,
/// which nothing in the sandbox has.
pub(crate) async fn takeover(
    site: &ContainerSite,
    ledger: &Ledger<Own>,
    link_id: &str,
    within: Duration,
) -> Result<Transport, String> {
    let relay_user = (site.config.uid_gid().0 != 0).then_some("0:0");
    let argv = stevedore_init::wire::relay_argv(link_id, within);
    let attached = site
        .engine
        .api
        .exec(&ledger.own.container_id, argv, relay_user)
        .await
        .map_err(|e| crate::util::error_chain(&e))?;
    Ok(super::launch::transport(attached))
}
