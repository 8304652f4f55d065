//! stevedore's init image: `FROM scratch` + the embedded static init at `/stevedore-init`,
//! labelled with its sha256. The kube rung's Pods copy the init out of it in an init
//! container, so a cluster must be able to pull it: pack it here, then push it to a registry
//! the cluster pulls from (or import it into the nodes' runtime, as the tests do).

use super::pack::{PackError, build_image_from_dir_tar};
use super::tarball::append_bytes;
use crate::engine::Engine;
use crate::labels;

/// Where the init is in the image (the kube rung's init container runs it there).
pub const INIT_PATH: &str = "/stevedore-init";

/// The image, packed as `tag` unless an image of that tag already holds this very init
/// (by its digest label); the image's id, and whether it was already there.
pub async fn pack_init_image(engine: &Engine, tag: &str) -> Result<(String, bool), PackError> {
    let digest = crate::sandbox::init_binary::sha256();
    if let Some(image) = engine.api.image_info(tag).await?
        && image.labels.get(labels::TOOLS_DIGEST).map(String::as_str) == Some(digest)
    {
        return Ok((image.id, true));
    }
    let Some(init) = crate::sandbox::init_binary::bytes() else {
        return Err(PackError::Build { tag: tag.to_owned(), message: "this build embeds no init".into() });
    };
    let dockerfile = format!(
        "FROM scratch\nCOPY stevedore-init {INIT_PATH}\nENTRYPOINT [\"{INIT_PATH}\"]\n\
         LABEL {}={digest}\n",
        labels::TOOLS_DIGEST
    );
    let mut context = tar::Builder::new(Vec::new());
    append_bytes(&mut context, "Dockerfile", 0o644, dockerfile.as_bytes()).map_err(PackError::Context)?;
    append_bytes(&mut context, "stevedore-init", 0o555, init).map_err(PackError::Context)?;
    let id = build_image_from_dir_tar(engine, tag, context.into_inner().map_err(PackError::Context)?).await?;
    Ok((id, false))
}
