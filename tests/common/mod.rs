//! Shared test harness: run one body on every rank of an in-process world.
#![allow(dead_code)]

use std::time::Duration;
use strata::{Comm, CommConfig, Result, Topology};

/// Config with a short timeout so a broken test fails fast instead of hanging.
pub fn config() -> CommConfig {
    CommConfig {
        algo: strata::Algo::Auto,
        timeout: Duration::from_secs(20),
        ho_ring_chunks: None,
        links: strata::config::LinkSource::Preset,
    }
}

/// Run `body` on every rank of a local world of `topo` (threads), collecting results.
pub fn on_local<T: Send + 'static>(
    topo: &str,
    body: impl Fn(Comm) -> Result<T> + Send + Sync + 'static,
) -> Vec<Result<T>> {
    on_local_with(topo, config(), body)
}

/// `on_local` with a given configuration.
pub fn on_local_with<T: Send + 'static>(
    topo: &str,
    cfg: CommConfig,
    body: impl Fn(Comm) -> Result<T> + Send + Sync + 'static,
) -> Vec<Result<T>> {
    let topo = Topology::parse(topo).expect("topology");
    let n = topo.world_size();
    on_comms(Comm::local_world(n, Some(topo), cfg).expect("world"), body)
}

/// Run `body` on every communicator of a world, one thread each, collecting results.
pub fn on_comms<T: Send + 'static>(
    comms: Vec<Comm>,
    body: impl Fn(Comm) -> Result<T> + Send + Sync + 'static,
) -> Vec<Result<T>> {
    let body = std::sync::Arc::new(body);
    let hs: Vec<_> = comms
        .into_iter()
        .map(|c| {
            let b = body.clone();
            std::thread::spawn(move || b(c))
        })
        .collect();
    hs.into_iter()
        .map(|h| h.join().expect("rank thread panicked"))
        .collect()
}

/// `on_local` and unwrap every rank's result.
pub fn all_ok<T: Send + 'static>(
    topo: &str,
    body: impl Fn(Comm) -> Result<T> + Send + Sync + 'static,
) -> Vec<T> {
    on_local(topo, body)
        .into_iter()
        .enumerate()
        .map(|(r, x)| x.unwrap_or_else(|e| panic!("rank {r}: {e}")))
        .collect()
}
