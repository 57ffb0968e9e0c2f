//! The README's Rust example: a 16-rank in-process world on two Frontier nodes, one
//! thread per rank, a nonblocking hierarchical all-gather and a dependent all-reduce on
//! a sub-communicator. `cargo run --example quickstart`.

use strata::{Algo, Buffer, Comm, CommConfig, DataType, Op, ReduceOp, Request, Topology};

fn main() -> strata::Result<()> {
    let comms = Comm::local_world(
        16,
        Some(Topology::parse("frontier:2")?),
        CommConfig::default(),
    )?;
    let threads: Vec<_> = comms
        .into_iter()
        .map(|comm| {
            std::thread::spawn(move || -> strata::Result<(usize, f32, f32)> {
                let r = comm.rank();
                let send = Buffer::from_slice(&[r as f32; 1024]);
                let recv = Buffer::zeroed(16 * 1024 * 4);
                // Nonblocking: returns at once; MiCS hierarchical all-gather over 3 levels.
                let gathered = comm.submit(
                    Request::new(
                        Op::AllGather {
                            send,
                            recv: recv.clone(),
                            count: 1024,
                        },
                        DataType::F32,
                    )
                    .with_algo(Algo::Hier),
                )?;
                // The ranks of this node reduce what was gathered, once the gather is done.
                let node = comm.node_comm()?;
                let summed = Buffer::zeroed(16 * 1024 * 4);
                let w = node.submit(
                    Request::new(
                        Op::AllReduce {
                            send: recv.clone(),
                            recv: summed.clone(),
                            count: 16 * 1024,
                            op: ReduceOp::Avg,
                        },
                        DataType::F32,
                    )
                    .after([gathered]),
                )?;
                w.wait()?;
                let v = summed.to_vec::<f32>()?;
                Ok((r, v[1024 * 5], v[1024 * 15]))
            })
        })
        .collect();
    for t in threads {
        let (r, a, b) = t.join().expect("rank thread")?;
        if r % 8 == 0 {
            println!("rank {r}: gathered value of rank 5 = {a}, of rank 15 = {b}");
        }
    }
    Ok(())
}
