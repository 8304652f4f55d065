//! The action of an init-backed attempt (`docs/outcome.md`, "Action digest"): the request's
//! part and the rung's, decided when the command is told to start and kept in the ledger (so
//! a recovered attempt has it too), sealed into its digest once the rung's evidence is in
//! (the kube rung learns the image's id only from the Pod's status).

use super::site::Site;
use crate::contract::{Action, ActionKey, Evidence, InputsStaged, Request};

/// The attempt's action, unsealed.
pub(crate) fn of<S: Site>(site: &S, req: &Request, own: &S::Own, inputs: Option<&InputsStaged>) -> Action {
    let rung = site.rung();
    let mut action = Action::of_request(req, rung.name, Some(rung.level));
    // Every init-backed rung runs the init this build embeds (the kube rung's init image is
    // made from the same bytes, `stevedore image init`).
    action.init = Some(format!("sha256:{}", crate::sandbox::init_binary::sha256()));
    action.staged(inputs);
    site.action(own, &mut action);
    action
}

/// The action sealed: the image id the evidence names when the rung had none before, then
/// the digests, and the MAC under `key`.
pub(crate) fn sealed(action: Option<Action>, ev: &Evidence, key: Option<&ActionKey>) -> Option<Action> {
    let mut action = action?;
    if action.image_id.is_none() {
        action.image_id.clone_from(&ev.image_id);
    }
    if action.image.is_none() {
        action.image.clone_from(&ev.image);
    }
    action.seal(&ev.enforcement, &ev.skipped, key);
    Some(action)
}
