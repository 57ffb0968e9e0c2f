//! Shared test harness: run one body on every rank of an in-process world.
#![allow(dead_code)]

use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;
use strata::traffic::TrafficReport;
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

/// Runs `body` twice on every rank of a local world of `topo` (threads, meeting between
/// the calls) and returns the traffic of the second call alone.
pub fn second_call_traffic(
    topo: &str,
    body: impl Fn(&Comm) + Send + Sync + 'static,
) -> TrafficReport {
    let t = Topology::parse(topo).unwrap();
    let comms = Comm::local_world(t.world_size(), Some(t.clone()), config()).unwrap();
    let traffic = comms[0].traffic().unwrap();
    // The first call warms up: it creates the level sub-communicators (their splits move
    // no bytes anyway).
    let bar = Arc::new(Barrier::new(comms.len()));
    let body = Arc::new(body);
    let before = Arc::new(Mutex::new(None));
    let hs: Vec<_> = comms
        .into_iter()
        .map(|c| {
            let (bar, body, before, traffic) =
                (bar.clone(), body.clone(), before.clone(), traffic.clone());
            std::thread::spawn(move || {
                body(&c);
                bar.wait();
                if c.rank() == 0 {
                    *before.lock().unwrap() = Some(traffic.snapshot());
                }
                bar.wait();
                body(&c);
            })
        })
        .collect();
    hs.into_iter().for_each(|h| h.join().unwrap());
    let b = before.lock().unwrap().take().unwrap();
    traffic.snapshot().since(&b).report(&t)
}
