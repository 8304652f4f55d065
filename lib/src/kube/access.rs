//! What the rung's credentials may do, asked of the API server once (SelfSubjectAccessReview,
//! which every authenticated user may create): an attempt that could not be seen through, a
//! takeover that could never come, is refused before its Pod exists, naming the verb and the
//! resource that are missing.

use super::error::ClusterError;
use super::site::KubeSite;
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec};
use kube::api::{Api, PostParams};

/// What the rung does, as (resource, subresource, verbs, whether any one of the verbs is
/// enough). WebSocket upgrades (attach, exec) are authorized as `get` on older servers (1.20)
/// and as `create` on newer ones: either will do, and a 403 at the upgrade itself still says
/// which resource it was.
pub(crate) const NEEDED: &[(&str, &str, &[&str], bool)] = &[
    ("pods", "", &["create", "get", "list", "watch", "delete"], false),
    ("pods", "attach", &["get", "create"], true),
    ("pods", "exec", &["get", "create"], true),
];

/// Checks [`NEEDED`] once per rung (a success is kept; a refusal is asked again next time,
/// since an administrator may grant it meanwhile).
pub(crate) async fn ensure(site: &KubeSite) -> Result<(), ClusterError> {
    let mut checked = site.access.lock().await;
    if *checked {
        return Ok(());
    }
    let reviews: Api<SelfSubjectAccessReview> = Api::all(site.client.clone());
    for (resource, sub, verbs, any) in NEEDED {
        let mut missing = Vec::new();
        for verb in *verbs {
            let review = SelfSubjectAccessReview {
                spec: SelfSubjectAccessReviewSpec {
                    resource_attributes: Some(ResourceAttributes {
                        namespace: Some(site.namespace.clone()),
                        verb: Some((*verb).to_owned()),
                        resource: Some((*resource).to_owned()),
                        subresource: (!sub.is_empty()).then(|| (*sub).to_owned()),
                        ..Default::default()
                    }),
                    non_resource_attributes: None,
                },
                ..Default::default()
            };
            let answer = site
                .call(
                    "asking the API server what the credentials may do",
                    reviews.create(&PostParams::default(), &review),
                )
                .await?;
            if !answer.status.is_some_and(|s| s.allowed) {
                missing.push(*verb);
            }
        }
        if !missing.is_empty() && (!*any || missing.len() == verbs.len()) {
            let resource = if sub.is_empty() { (*resource).to_owned() } else { format!("{resource}/{sub}") };
            return Err(ClusterError::Forbidden {
                verb: missing.join(", "),
                resource,
                namespace: site.namespace.clone(),
            });
        }
    }
    *checked = true;
    Ok(())
}
