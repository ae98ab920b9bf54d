//! The lock-safety checker on the docker-compose cluster (image `vigil:dev` from
//! `docker/build.sh`), with every fault applied by its script in `docker/faults/`. Skipped,
//! with a message, where `docker info` fails. Where Docker works the image must have been built
//! (`scripts/install-test-deps.sh`, part of the README's test command, runs `docker/build.sh`).

use integration_tests::safety::{DockerStatus, Plan, docker_status, run_docker};

use crate::common::{assert_safe, exclusive};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_in_docker_never_let_a_stale_holder_write() {
    let _heavy = exclusive().await;
    match docker_status() {
        DockerStatus::Ready => {}
        DockerStatus::NoDocker(why) => {
            eprintln!("SKIPPED: the Docker scenario needs a Docker engine ({why})");
            return;
        }
        DockerStatus::NotBuilt(why) => panic!(
            "Docker works but the scenario cannot run ({why}): run scripts/install-test-deps.sh \
             (it builds the image with docker/build.sh)"
        ),
    }
    let plan = Plan::docker(82).with_env_overrides();
    let report = run_docker(&plan).await.expect("the checker's run");
    println!("{report}");
    assert_safe(&report, &plan);
}
