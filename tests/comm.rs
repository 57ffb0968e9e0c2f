//! Communicator mechanics: nonblocking handles, cross-communicator dependencies,
//! groups, split.
mod common;

use strata::{Algo, Buffer, DataType, Op, ReduceOp, Request};

#[test]
fn collectives_are_nonblocking() {
    let gate = std::sync::Arc::new(std::sync::Barrier::new(2));
    common::all_ok("nodes:1x2", move |c| {
        let buf = Buffer::zeroed(4 * 3);
        if c.rank() == 0 {
            let w = c.recv(&buf, 3, DataType::F32, 1)?;
            // Rank 1 has not sent yet (it waits at the gate): the handle is pending.
            std::thread::sleep(std::time::Duration::from_millis(30));
            assert!(!w.is_done());
            gate.wait();
            w.wait()?;
            assert_eq!(buf.to_vec::<f32>()?, vec![1.0, 2.0, 3.0]);
        } else {
            gate.wait();
            c.send(
                &Buffer::from_slice(&[1.0f32, 2.0, 3.0]),
                3,
                DataType::F32,
                0,
            )?
            .wait()?;
        }
        Ok(())
    });
}

#[test]
fn grouped_send_recv_exchange_does_not_deadlock() {
    common::all_ok("nodes:2x2", |c| {
        let (p, r) = (c.size(), c.rank());
        let inc = Buffer::zeroed(4 * 100);
        strata::group_start();
        // Receive posted before the send: the group launches them together.
        let wr = c.recv(&inc, 100, DataType::F32, (r + p - 1) % p)?;
        let ws = c.send(
            &Buffer::from_slice(&[r as f32; 100]),
            100,
            DataType::F32,
            (r + 1) % p,
        )?;
        strata::group_end()?;
        wr.wait()?;
        ws.wait()?;
        assert!(inc
            .to_vec::<f32>()?
            .iter()
            .all(|v| *v == ((r + p - 1) % p) as f32));
        Ok(())
    });
}

#[test]
fn split_orders_by_key_and_runs_collectives() {
    let out = common::all_ok("nodes:2x3", |c| {
        let color = (c.rank() % 2) as u32;
        let key = -(c.rank() as i32); // reverse order inside each color
        let sub = c.split(Some(color), key)?.expect("member");
        let opted_out = c.split(if c.rank() == 0 { None } else { Some(0) }, 0)?;
        assert_eq!(opted_out.is_none(), c.rank() == 0);
        let s = Buffer::from_slice(&[c.rank() as f32]);
        let r = Buffer::zeroed(4 * sub.size());
        sub.all_gather(&s, &r, 1, DataType::F32)?.wait()?;
        Ok((sub.rank(), sub.members().to_vec(), r.to_vec::<f32>()?))
    });
    assert_eq!(out[0], (2, vec![4, 2, 0], vec![4.0, 2.0, 0.0]));
    assert_eq!(out[5], (0, vec![5, 3, 1], vec![5.0, 3.0, 1.0]));
}

#[test]
fn dependencies_order_work_across_communicators() {
    common::all_ok("nodes:2x2", |c| {
        // Stage 1 on the node communicator, stage 2 on the rail communicator, which must
        // wait for stage 1's output: a hand-made 2-level all-reduce.
        let node = c
            .split(Some((c.rank() / 2) as u32), c.rank() as i32)?
            .unwrap();
        let rail = c
            .split(Some((c.rank() % 2) as u32), c.rank() as i32)?
            .unwrap();
        let x = Buffer::from_slice(&[c.rank() as f32 + 1.0; 1000]);
        let w1 = node.all_reduce(&x, &x, 1000, DataType::F32, ReduceOp::Sum)?;
        let w2 = rail.submit(
            Request::new(
                Op::AllReduce {
                    send: x.clone(),
                    recv: x.clone(),
                    count: 1000,
                    op: ReduceOp::Sum,
                },
                DataType::F32,
            )
            .after([w1]),
        )?;
        w2.wait()?;
        assert!(x.to_vec::<f32>()?.iter().all(|v| *v == 10.0));
        Ok(())
    });
}

#[test]
fn group_launches_many_as_one() {
    common::all_ok("nodes:2x2", |c| {
        let bufs: Vec<_> = (0..5)
            .map(|i| Buffer::from_slice(&vec![(i + c.rank()) as f32; 3 + i]))
            .collect();
        strata::group_start();
        let ws: Vec<_> = bufs
            .iter()
            .enumerate()
            .map(|(i, b)| c.all_reduce(b, b, 3 + i, DataType::F32, ReduceOp::Max))
            .collect::<Result<_, _>>()?;
        assert!(ws.iter().all(|w| !w.is_done()), "held until the group ends");
        strata::group_end()?;
        for (i, w) in ws.iter().enumerate() {
            w.wait()?;
            assert!(bufs[i]
                .to_vec::<f32>()?
                .iter()
                .all(|v| *v == (i + 3) as f32));
        }
        Ok(())
    });
}

#[test]
fn hierarchy_detection_and_fallback() {
    let out = common::all_ok("frontier:2", |c| {
        let h = c.hierarchy().expect("regular").sizes();
        // A partition group of one node (MiCS): a 2-level sub-mesh (4 packages x 2 dies).
        let node = c
            .split(Some((c.rank() / 8) as u32), c.rank() as i32)?
            .unwrap();
        let hn = node.hierarchy().expect("regular").sizes();
        // An irregular group: ranks {0,1,2} of each node: hier falls back to ring, still correct.
        let odd = c.split(
            if c.rank() % 8 < 3 { Some(0) } else { None },
            c.rank() as i32,
        )?;
        if let Some(odd) = &odd {
            assert!(odd.hierarchy().is_none());
            let w = strata::check::run_checked(
                odd,
                strata::check::Kind::AllGather,
                DataType::BF16,
                ReduceOp::Sum,
                13,
                Algo::Hier,
                false,
                3,
            )?;
            assert_eq!(w, 0);
        }
        Ok((h, hn))
    });
    assert_eq!(out[0], (vec![2, 4, 2], vec![4, 2]));
}

#[test]
fn node_and_rail_communicators() {
    let out = common::all_ok("frontier:2", |c| {
        let node = c.node_comm()?;
        let rail = c.rail_comm()?;
        Ok((
            node.members().to_vec(),
            rail.members().to_vec(),
            node.rank(),
            rail.rank(),
        ))
    });
    assert_eq!(out[9], ((8..16).collect::<Vec<_>>(), vec![1, 9], 1, 1));
    let one = common::all_ok("nodes:1x3", |c| {
        Ok((c.node_comm()?.size(), c.rail_comm()?.size()))
    });
    assert_eq!(one[2], (3, 1));
}

#[test]
fn sub_communicators_from_user_threads_while_algorithms_run() {
    // The world's stream splits level communicators inside `hier`; the user thread asks
    // for the node communicator meanwhile: splits must still line up on every rank.
    common::all_ok("frontier:2", |c| {
        let send = Buffer::from_slice(&[c.rank() as f32; 64]);
        let recv = Buffer::zeroed(16 * 64 * 4);
        let w = c.submit(
            Request::new(
                Op::AllGather {
                    send,
                    recv: recv.clone(),
                    count: 64,
                },
                DataType::F32,
            )
            .with_algo(Algo::Hier),
        )?;
        let node = c.node_comm()?;
        let rail = c.rail_comm()?;
        let out = Buffer::zeroed(16 * 64 * 4);
        node.submit(
            Request::new(
                Op::AllReduce {
                    send: recv.clone(),
                    recv: out.clone(),
                    count: 16 * 64,
                    op: ReduceOp::Max,
                },
                DataType::F32,
            )
            .after([w]),
        )?
        .wait()?;
        assert_eq!(rail.size(), 2);
        let v = out.to_vec::<f32>()?;
        assert!((0..16).all(|r| v[r * 64] == r as f32));
        Ok(())
    });
}

#[test]
fn blocking_call_keeps_stream_order_and_dependencies() {
    common::all_ok("nodes:2x2", |c| {
        let p = c.size() as f32;
        let x = Buffer::from_slice(&[c.rank() as f32 + 1.0; 777]);
        let sum = |b: &Buffer| {
            Request::new(
                Op::AllReduce {
                    send: b.clone(),
                    recv: b.clone(),
                    count: 777,
                    op: ReduceOp::Sum,
                },
                DataType::F32,
            )
        };
        // Nothing queued: runs on this thread, done when it returns.
        c.call(sum(&x))?;
        let s1: f32 = (1..=c.size()).map(|r| r as f32).sum();
        assert!(x.to_vec::<f32>()?.iter().all(|v| *v == s1));
        // Queued work ahead (not waited): the blocking call runs after it, in order.
        let w = c.all_reduce(&x, &x, 777, DataType::F32, ReduceOp::Sum)?;
        c.call(sum(&x))?;
        assert!(w.is_done(), "the call ran after the work queued before it");
        assert!(x.to_vec::<f32>()?.iter().all(|v| *v == s1 * p * p));
        // A dependency on another communicator is waited for first.
        let node = c
            .split(Some((c.rank() / 2) as u32), c.rank() as i32)?
            .unwrap();
        let y = Buffer::from_slice(&[1.0f32; 777]);
        let w1 = node.all_reduce(&y, &y, 777, DataType::F32, ReduceOp::Sum)?;
        c.call(sum(&y).after([w1]))?;
        assert!(y.to_vec::<f32>()?.iter().all(|v| *v == 2.0 * p));
        Ok(())
    });
}

#[test]
fn blocking_call_inside_a_group_is_refused() {
    common::all_ok("nodes:1x2", |c| {
        let x = Buffer::from_slice(&[1.0f32; 4]);
        let sum = || {
            Request::new(
                Op::AllReduce {
                    send: x.clone(),
                    recv: x.clone(),
                    count: 4,
                    op: ReduceOp::Sum,
                },
                DataType::F32,
            )
        };
        strata::group_start();
        let e = c.call(sum()).unwrap_err();
        strata::group_end()?;
        assert!(
            matches!(e, strata::Error::InvalidUsage(_)) && e.to_string().contains("inside a group"),
            "{e}"
        );
        // Nothing was queued: the communicator still works.
        c.call(sum())?;
        assert_eq!(x.to_vec::<f32>()?, vec![2.0; 4]);
        Ok(())
    });
}
