//! Benchmark: what one attempt costs on top of a bare container, and what the disk limit's
//! tmpfs volumes cost. Prints ratios; asserts nothing.
//!
//! ```sh
//! cargo run --release --example overhead -- [IMAGE] [N]
//! ```
//! IMAGE must hold `/bin/true` (default `stevedore-test/busybox:latest`, which the tests
//! build; see `images/busybox`). N attempts of each kind, one at a time (default 20).

use bollard::Docker;
use bollard::models::{ContainerCreateBody, HostConfig, VolumeCreateRequest};
use bollard::query_parameters::RemoveContainerOptionsBuilder;
use futures_util::StreamExt;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use stevedore::container::{ContainerConfig, ContainerExecutor};
use stevedore::{Executor, Request, Status};
use tokio_util::sync::CancellationToken;

fn main() {
    // This binary is also the init stevedore injects into the container.
    stevedore::sandbox::main_hook(&stevedore::handlers::Handlers::new());
    tokio::runtime::Runtime::new().unwrap().block_on(bench());
}

async fn bench() {
    let mut args = std::env::args().skip(1);
    let image = args.next().unwrap_or_else(|| "stevedore-test/busybox:latest".into());
    let n: u32 = args.next().map(|s| s.parse().expect("N is a number")).unwrap_or(20);
    let docker = Docker::connect_with_local_defaults().unwrap().negotiate_version().await.unwrap();

    // A bare container: create, start, wait, remove (what `docker run --rm` does).
    let bare = time(n, || async {
        let body = ContainerCreateBody {
            image: Some(image.clone()),
            cmd: Some(vec!["/bin/true".into()]),
            network_disabled: Some(true),
            host_config: Some(HostConfig { network_mode: Some("none".into()), ..Default::default() }),
            ..Default::default()
        };
        let id = docker.create_container(None, body).await.unwrap().id;
        docker.start_container(&id, None).await.unwrap();
        let _ = docker.wait_container(&id, None).next().await;
        docker.remove_container(&id, Some(RemoveContainerOptionsBuilder::new().force(true).build())).await.unwrap();
    })
    .await;

    // The disk limit's price: one size-capped tmpfs volume, created and removed.
    let volume = time(n, || async {
        let name = format!("stevedore-bench-{:08x}", rand::random::<u32>());
        let opts = HashMap::from([
            ("type".to_owned(), "tmpfs".to_owned()),
            ("device".to_owned(), "tmpfs".to_owned()),
            ("o".to_owned(), "size=536870912,uid=65532,gid=65532".to_owned()),
        ]);
        let req = VolumeCreateRequest { name: Some(name.clone()), driver_opts: Some(opts), ..Default::default() };
        docker.create_volume(req).await.unwrap();
        docker.remove_volume(&name, None::<bollard::query_parameters::RemoveVolumeOptions>).await.unwrap();
    })
    .await;

    // A whole stevedore attempt of the same command, all hardening on.
    let rung = ContainerExecutor::connect(ContainerConfig::default()).await.expect("engine reachable");
    let dir = tempfile::tempdir().unwrap();
    let mut i = 0;
    let attempt = time(n, || {
        i += 1;
        let mut req = Request::command("bench", ["/bin/true"], dir.path().join(i.to_string())).worker("bench");
        req.policy.image = image.clone();
        let rung = &rung;
        async move {
            let o = rung.run(&req, CancellationToken::new()).await.expect("launched");
            assert_eq!(o.status, Status::Ok, "{}", o.to_json());
        }
    })
    .await;
    rung.close().await;

    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!("{n} runs each, one at a time, image {image}");
    println!("bare container (create+start+wait+remove): {:7.1} ms", ms(bare));
    println!("stevedore attempt (/bin/true):             {:7.1} ms", ms(attempt));
    println!("  ratio attempt / bare:                     {:7.2}", attempt.as_secs_f64() / bare.as_secs_f64());
    println!("tmpfs volume create+remove (disk limit):   {:7.1} ms", ms(volume));
    println!(
        "  two per attempt (/out, control) / attempt: {:5.1} %",
        200.0 * volume.as_secs_f64() / attempt.as_secs_f64()
    );
}

/// The median duration of `n` runs of `f`.
async fn time<F, Fut>(n: u32, mut f: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut times = Vec::new();
    for _ in 0..n.max(1) {
        let t = Instant::now();
        f().await;
        times.push(t.elapsed());
    }
    times.sort();
    times[times.len() / 2]
}
