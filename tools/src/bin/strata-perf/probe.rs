//! `--probe FILE`: measure the world's links with the link probe
//! ([`strata::comm::probe`], afresh) over the chosen transport, check that every rank
//! holds the same figures, write the topology with them to FILE and print them.

use crate::cli::Cli;
use std::path::Path;
use strata::config::LinkSource;
use strata::topology::{LinkClass, Topology};
use strata::transport::TransportKind;
use strata::{Comm, CommConfig, DataType, Error, Result};

/// Runs the probe; Ok(0) when the file was written.
pub(crate) fn run_probe(
    cli: &Cli,
    config: CommConfig,
    topo: Option<Topology>,
    path: &Path,
) -> Result<u64> {
    let config = CommConfig {
        links: LinkSource::Reprobe,
        ..config
    };
    let comm = match cli.transport {
        TransportKind::Mpi => Comm::mpi_world(topo, config)?,
        k @ (TransportKind::Nccl | TransportKind::Rccl) => {
            let boot = crate::launch::vendor_boot(cli, &config, topo)?;
            Comm::vendor_world(&boot, k, config)?
        }
        k => {
            let ranks = crate::launch::thread_ranks(cli, topo.as_ref());
            let topo = topo.unwrap_or_else(|| Topology::flat(ranks));
            let comms = Comm::in_process_world(k, ranks, Some(topo), config)?;
            if comms.iter().any(|c| c.topology() != comms[0].topology()) {
                return Err(Error::Internal("ranks disagree on the probed links".into()));
            }
            comms
                .into_iter()
                .next()
                .ok_or_else(|| Error::Internal("no ranks".into()))?
        }
    };
    let t = comm.topology().clone();
    if !matches!(
        cli.transport,
        TransportKind::Local | TransportKind::CudaLocal | TransportKind::HostLocal
    ) {
        agree(&comm, &t)?;
    }
    if comm.rank() == 0 {
        t.save(path)?;
        print(&t, comm.transport_kind(), path);
    }
    Ok(0)
}

/// Every process's figures, hashed and all-gathered: an error unless all are equal.
fn agree(comm: &Comm, t: &Topology) -> Result<()> {
    let h = strata::topology::detect::fnv1a(t.to_json().as_bytes());
    let p = comm.size();
    let send = comm.native_from(&h.to_le_bytes())?;
    let recv = comm.alloc_native(8 * p)?;
    comm.all_gather(&send, &recv, 1, DataType::U64)?.wait()?;
    let all = recv.to_bytes()?;
    match all.chunks_exact(8).position(|c| c != h.to_le_bytes()) {
        None => Ok(()),
        Some(r) => Err(Error::Internal(format!(
            "rank {r} probed other link figures than rank {}",
            comm.rank()
        ))),
    }
}

fn print(t: &Topology, kind: TransportKind, path: &Path) {
    let m = t.measured.as_ref();
    println!(
        "# link probe: {} over {} ({} ranks), {:.3} s",
        t.name,
        kind.name(),
        t.world_size(),
        m.map_or(0.0, |m| m.seconds)
    );
    println!(
        "# {:>13}  {:>11}  {:>13}",
        "class", "latency_us", "bandwidth_GBs"
    );
    for c in m.map(|m| m.classes.clone()).unwrap_or_default() {
        let l = t.links.get(c);
        println!(
            "  {:>13}  {:>11.2}  {:>13.4}",
            c.name(),
            l.latency_us,
            l.bandwidth_gbs
        );
        if let (LinkClass::InterNode, Some(l)) = (c, t.links.lone_latency_us) {
            println!("# inter_node latency with one rank per node crossing: {l:.2} us");
        }
        if c == LinkClass::InterNode {
            println!(
                "# a node's egress: {:.4} GB/s ({} ranks per node share it; {:.1} Mbit/s)",
                t.links.node_egress_gbs(),
                t.ranks_per_node(),
                t.links.node_egress_gbs() * 8e3
            );
        }
    }
    if let Some(o) = t.links.overlap {
        println!("# link classes at once: overlap {o:.2} (1: as the slowest alone, 0: one after another)");
    }
    if let Some(h) = t.links.handoff_us {
        println!(
            "# ho-ring's handoff: {h:.1} us per piece step of its busiest level, beyond its links"
        );
    }
    if let Some(h) = t.links.host {
        println!(
            "# host path: copy {:.3} GB/s, f32 sum reduction {:.3} GB/s per rank",
            h.copy_gbs, h.reduce_gbs
        );
    }
    println!(
        "# wrote {}: use it as STRATA_TOPOLOGY, --topology, --model, strata-sim --topology",
        path.display()
    );
}
