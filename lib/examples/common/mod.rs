//! What the examples share: the busybox test image (built as the integration tests build
//! it, so the two share it) and the check that nothing labelled for a worker is left.

use bollard::Docker;
use bollard::query_parameters::{ListContainersOptionsBuilder, ListVolumesOptionsBuilder};
use std::collections::HashMap;
use stevedore::container::labels;

/// The shared busybox test image.
pub const BUSYBOX_IMAGE: &str = "stevedore-test/busybox:latest";
const TEST_LABEL: &str = "dev.stevedore.test";
const BUSYBOX_SHA_LABEL: &str = "dev.stevedore.test.busybox_sha256";
const BUSYBOX: &str = "/bin/busybox";

/// The examples' own client of the engine `DOCKER_HOST` names (else the local socket):
/// what they check, they check without stevedore's help.
pub async fn raw_docker() -> Result<Docker, String> {
    let docker = Docker::connect_with_defaults().map_err(|e| format!("no engine: {e}"))?;
    docker.negotiate_version().await.map_err(|e| format!("no engine: {e}"))
}

/// The containers and volumes in the engine labelled as `worker`'s.
pub async fn leftovers(docker: &Docker, worker: &str) -> Result<Vec<String>, String> {
    let filters = labels::worker_filter(worker);
    let containers = docker
        .list_containers(Some(ListContainersOptionsBuilder::default().all(true).filters(&filters).build()))
        .await
        .map_err(|e| format!("listing containers: {e}"))?;
    let volumes = docker
        .list_volumes(Some(ListVolumesOptionsBuilder::default().filters(&filters).build()))
        .await
        .map_err(|e| format!("listing volumes: {e}"))?;
    // Checked again here: Podman ORs repeated label filters.
    let mine = |l: &HashMap<String, String>| labels::reclaimable_by(l, worker);
    let mut left: Vec<String> = containers
        .into_iter()
        .filter(|c| c.labels.as_ref().is_some_and(mine))
        .map(|c| format!("container {}", c.id.unwrap_or_default()))
        .collect();
    left.extend(
        volumes
            .volumes
            .unwrap_or_default()
            .into_iter()
            .filter(|v| mine(&v.labels))
            .map(|v| format!("volume {}", v.name)),
    );
    Ok(left)
}

/// Builds the busybox image (`FROM scratch`, Debian's static busybox installed in /bin)
/// unless it is there already for this very `/bin/busybox`.
pub async fn build_busybox(docker: &Docker, engine: &stevedore::engine::Engine) -> Result<(), String> {
    let file = std::fs::File::open(BUSYBOX)
        .map_err(|e| format!("{BUSYBOX} is needed (apt-get install busybox-static): {e}"))?;
    let hashed = stevedore::hash_reader(file, 0).map_err(|e| format!("reading {BUSYBOX}: {e}"))?;
    let sha = hashed.hash.trim_start_matches("sha256:").to_owned();
    if let Ok(image) = docker.inspect_image(BUSYBOX_IMAGE).await {
        let labels = image.config.and_then(|c| c.labels).unwrap_or_default();
        if labels.get(TEST_LABEL).is_some_and(|v| v == "true") && labels.get(BUSYBOX_SHA_LABEL) == Some(&sha) {
            return Ok(());
        }
    }
    println!("building {BUSYBOX_IMAGE} from {BUSYBOX}");
    let dockerfile = format!(
        "FROM scratch\nCOPY busybox /bin/busybox\n\
         RUN [\"/bin/busybox\",\"--install\",\"-s\",\"/bin\"]\n\
         LABEL {TEST_LABEL}=true {BUSYBOX_SHA_LABEL}={sha}\n"
    );
    let busybox = std::fs::read(BUSYBOX).map_err(|e| format!("reading {BUSYBOX}: {e}"))?;
    let context = tar_of(&[("Dockerfile", 0o644, dockerfile.as_bytes()), ("busybox", 0o755, &busybox)])
        .map_err(|e| format!("the build context: {e}"))?;
    stevedore::image::build_image_from_dir_tar(engine, BUSYBOX_IMAGE, context)
        .await
        .map_err(|e| format!("building {BUSYBOX_IMAGE}: {e}"))?;
    Ok(())
}

/// A tar of in-memory files, owned by 0:0.
fn tar_of(files: &[(&str, u32, &[u8])]) -> std::io::Result<Vec<u8>> {
    let mut tar = tar::Builder::new(Vec::new());
    for (path, mode, data) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(*mode);
        header.set_uid(0);
        header.set_gid(0);
        tar.append_data(&mut header, path, *data)?;
    }
    tar.into_inner()
}
