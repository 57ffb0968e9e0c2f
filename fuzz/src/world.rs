//! Running one [`World`]: a coordinator thread and one thread per rank, in lockstep
//! (a barrier before every step), so that every rank makes the same valid collective
//! while the bad calls of different ranks interleave freely; the world's end may break
//! it (abort from the coordinator while the ranks are inside a collective, destroy
//! during work, abandoned groups), after which every rank must see an error, never hang.

use crate::bad::{self, Env};
use crate::coll::{Coll, Prep};
use crate::ffi::{Call, Ctx, Expect, H, OK, USAGE};
use crate::script::{End, Init, Step, World, Wrap};
use crate::stats::STATS;
use std::ffi::{c_int, CString};
use std::ptr::{null, null_mut};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Barrier;
use std::time::Duration;
use strata::capi::*;

/// Make every call of `preps` (see [`Prep`]: each call's pointers point into its own
/// prep's buffers).
fn calls(ctx: &Ctx, preps: &[Prep], expect: Expect, comm_text: bool) -> Vec<c_int> {
    let mut rcs = Vec::new();
    for p in preps {
        for &c in &p.calls {
            // SAFETY: the pointers of `c` point into `p`'s buffers, sized for its counts,
            // alive and untouched by other threads until the call (or group) ends.
            rcs.push(unsafe { ctx.call_with(c, expect, comm_text) });
        }
    }
    rcs
}

fn call(ctx: &Ctx, c: Call, expect: Expect) -> c_int {
    // SAFETY: only calls whose pointers are NULL, handles, or locals of the caller.
    unsafe { ctx.call(c, expect) }
}

fn check(ctx: &Ctx, preps: &[Prep]) {
    for p in preps {
        match p.check() {
            Ok(()) => STATS.checked(),
            Err(e) => ctx.fail(format!("wrong result: {e}")),
        }
    }
}

fn group(ctx: &Ctx, depth: usize, start: bool) {
    for _ in 0..depth {
        call(
            ctx,
            if start {
                Call::GroupStart
            } else {
                Call::GroupEnd
            },
            OK,
        );
    }
}

fn config(w: &World, strs: &[Option<CString>; 2]) -> strataConfig_t {
    strataConfig_t {
        size: std::mem::size_of::<strataConfig_t>(),
        magic: STRATA_CONFIG_MAGIC,
        version: STRATA_VERSION_CODE as u32,
        transport: if w.n % 2 == 0 {
            strataTransportLocal
        } else {
            strataTransportDefault
        },
        topology: strs[0].as_ref().map_or(null(), |s| s.as_ptr()),
        algo: strs[1].as_ref().map_or(null(), |s| s.as_ptr()),
        timeout_ms: w.timeout_ms as c_int,
        links: null(),
    }
}

struct Shared<'a> {
    w: &'a World,
    handles: Vec<AtomicUsize>,
    dead: &'a [H],
    barrier: Barrier,
}

/// Run world `w`; its handles (all released by then) are appended to `dead`.
pub fn run(w: &World, dead: &mut Vec<H>, label: &str) {
    STATS.worlds.fetch_add(1, SeqCst);
    let n = w.n;
    let ctx = Ctx {
        label: format!("{label} n={n} {:?}", w.topology),
    };
    let strs = [
        w.topology.as_deref().map(|s| CString::new(s).unwrap()),
        w.algo.map(|s| CString::new(s).unwrap()),
    ];
    let cfg = config(w, &strs);
    let short = matches!(w.end, End::DestroyDuring(..));
    let ok;
    let mut hs = vec![0usize; n];
    let mut id = strataUniqueId {
        internal: [0; STRATA_UNIQUE_ID_BYTES],
    };
    match w.init {
        Init::Local { config } => {
            let c = if config || short {
                &cfg as *const _
            } else {
                null()
            };
            let t = strs[0].as_ref().map_or(null(), |s| s.as_ptr());
            let o = hs.as_mut_ptr() as *mut strataComm_t;
            ok = call(&ctx, Call::InitLocal(o, n as c_int, t, c), OK) == OK[0];
        }
        Init::Rank { .. } => {
            ok = call(&ctx, Call::UniqueId(&mut id), OK) == OK[0];
        }
    }
    if !ok {
        return;
    }
    let sh = Shared {
        w,
        handles: hs.iter().map(|&h| AtomicUsize::new(h)).collect(),
        dead,
        barrier: Barrier::new(n + 1),
    };
    std::thread::scope(|s| {
        let mut threads = Vec::with_capacity(n);
        for r in 0..n {
            let (sh, strs, id) = (&sh, &strs, id);
            let ctx = Ctx {
                label: format!("{} rank {r}", ctx.label),
            };
            let t = std::thread::Builder::new()
                .name(format!("rank{r}"))
                .spawn_scoped(s, move || rank(&ctx, sh, r, strs, id))
                .expect("spawn a rank thread");
            threads.push(t);
        }
        // The coordinator: in step with the ranks; aborts a victim at the end.
        sh.barrier.wait();
        for _ in &w.steps {
            sh.barrier.wait();
        }
        sh.barrier.wait();
        if let End::AbortDuring(v, delay_us, _) = &w.end {
            STATS.breaks.fetch_add(1, SeqCst);
            std::thread::sleep(Duration::from_micros(*delay_us));
            let h = sh.handles[*v].load(SeqCst);
            // SAFETY: a handle only; aborting from another thread is allowed.
            unsafe { ctx.call_with(Call::Abort(h), OK, false) };
        }
        sh.barrier.wait();
        // Joined one by one (pthread_join): the threads' thread-locals (strata's
        // per-thread error string, held group calls) are freed before the next world, so
        // leak checkers between inputs see none.
        for t in threads {
            if t.join().is_err() {
                STATS.fail("a rank thread panicked".into());
            }
        }
    });
    dead.extend(
        sh.handles
            .iter()
            .map(|h| h.load(SeqCst))
            .filter(|&h| h != 0),
    );
    let keep = dead.len().saturating_sub(32);
    dead.drain(..keep);
}

fn rank(ctx: &Ctx, sh: &Shared, r: usize, strs: &[Option<CString>; 2], id: strataUniqueId) {
    let (w, n) = (sh.w, sh.w.n);
    if let Init::Rank { config: with } = w.init {
        let mut h: strataComm_t = null_mut();
        let cfg = config(w, strs);
        let c = if with || matches!(w.end, End::DestroyDuring(..)) {
            &cfg as *const _
        } else {
            null()
        };
        if call(
            ctx,
            Call::InitRank(&mut h, n as c_int, id, r as c_int, c),
            OK,
        ) == OK[0]
        {
            sh.handles[r].store(h as H, SeqCst);
        }
    }
    sh.barrier.wait();
    let h = sh.handles[r].load(SeqCst);
    let env = Env {
        h,
        rank: r,
        n,
        dead: sh.dead,
    };
    for (i, step) in w.steps.iter().enumerate() {
        sh.barrier.wait();
        if h != 0 {
            let ctx = Ctx {
                label: format!("{} step {i}", ctx.label),
            };
            run_step(&ctx, sh, &env, step);
        }
    }
    sh.barrier.wait();
    if h != 0 {
        end(ctx, sh, &env);
    }
    sh.barrier.wait();
    if h != 0 {
        after_end(ctx, sh, &env);
    }
}

fn run_step(ctx: &Ctx, sh: &Shared, e: &Env, step: &Step) {
    let (h, r, n) = (e.h, e.rank, e.n);
    match step {
        Step::Coll(c, wrap) => {
            let depth = match wrap {
                Wrap::Plain => 0,
                Wrap::Group => 1,
                Wrap::Nested => 2,
            };
            let p = [c.prepare(h, r, n)];
            group(ctx, depth, true);
            calls(ctx, &p, OK, true);
            group(ctx, depth, false);
            check(ctx, &p);
        }
        Step::Multi(cs, bads, nested) => {
            let depth = 1 + *nested as usize;
            let preps: Vec<Prep> = cs.iter().map(|c| c.prepare(h, r, n)).collect();
            group(ctx, depth, true);
            for (i, p) in preps.iter().enumerate() {
                calls(ctx, std::slice::from_ref(p), OK, true);
                if i == 0 {
                    bad::run(ctx, &bads[r], e);
                }
            }
            group(ctx, depth, false);
            check(ctx, &preps);
        }
        Step::DriveAll(c) if r == 0 => {
            let preps: Vec<Prep> = (0..n)
                .map(|q| c.prepare(sh.handles[q].load(SeqCst), q, n))
                .collect();
            group(ctx, 1, true);
            calls(ctx, &preps, OK, true);
            group(ctx, 1, false);
            check(ctx, &preps);
        }
        Step::DriveAll(_) => {}
        Step::Bad(lists) => {
            for b in &lists[r] {
                bad::run(ctx, b, e);
            }
        }
        Step::Split(colors, keys, with_cfg, seed) => split(ctx, e, colors, keys, *with_cfg, *seed),
        Step::Side(m, c) if r == 0 => {
            let mut hs = vec![0usize; *m];
            let o = hs.as_mut_ptr() as *mut strataComm_t;
            if call(ctx, Call::InitLocal(o, *m as c_int, null(), null()), OK) != OK[0] {
                return;
            }
            let preps: Vec<Prep> = (0..*m).map(|q| c.prepare(hs[q], q, *m)).collect();
            group(ctx, 1, true);
            calls(ctx, &preps, OK, true);
            group(ctx, 1, false);
            check(ctx, &preps);
            for h in hs {
                call(ctx, Call::Destroy(h), OK);
            }
        }
        Step::Side(..) => {}
    }
}

fn split(ctx: &Ctx, e: &Env, colors: &[c_int], keys: &[c_int], with_cfg: bool, seed: u64) {
    let r = e.rank;
    let mut out: strataComm_t = 0x1 as strataComm_t;
    let c = config(
        &World {
            n: 2,
            topology: None,
            algo: None,
            init: Init::Local { config: false },
            timeout_ms: 0,
            steps: Vec::new(),
            end: End::Destroy,
        },
        &[None, None],
    );
    let cp = if with_cfg { &c as *const _ } else { null() };
    if call(ctx, Call::Split(e.h, colors[r], keys[r], &mut out, cp), OK) != OK[0] {
        return;
    }
    if colors[r] < 0 {
        if !out.is_null() {
            ctx.fail(format!("split with no color gave {out:?}, not NULL"));
        }
        return;
    }
    let mut members: Vec<usize> = (0..e.n).filter(|&q| colors[q] == colors[r]).collect();
    members.sort_by_key(|&q| (keys[q], q));
    let (m, pos) = (
        members.len(),
        members.iter().position(|&q| q == r).unwrap_or(0),
    );
    let sub = out as H;
    let (mut cnt, mut rk) = (0, -1);
    call(ctx, Call::Count(sub, &mut cnt), OK);
    call(ctx, Call::UserRank(sub, &mut rk), OK);
    if cnt as usize != m || rk as usize != pos {
        ctx.fail(format!(
            "split part: count {cnt} rank {rk}, want {m} and {pos}"
        ));
    }
    let coll = Coll {
        kind: crate::coll::Kind::AllReduce,
        dt: strataInt32,
        op: strataSum,
        count: 5,
        in_place: seed & 1 == 1,
        misalign: (seed >> 1) as usize % 4,
        seed,
    };
    let p = [coll.prepare(sub, pos, m)];
    calls(ctx, &p, OK, true);
    check(ctx, &p);
    call(ctx, Call::Destroy(sub), OK);
    call(ctx, Call::Count(sub, &mut cnt), USAGE);
}

const BROKEN: Expect = &[strataSuccess, strataInvalidUsage, strataRemoteError];

fn end(ctx: &Ctx, sh: &Shared, e: &Env) {
    let (h, r, n) = (e.h, e.rank, e.n);
    match &sh.w.end {
        End::Destroy => {
            call(ctx, Call::Destroy(h), OK);
        }
        End::Abort => {
            call(ctx, Call::Abort(h), OK);
        }
        End::AbortDuring(_, _, c) => {
            // The coordinator aborts the victim meanwhile: never read its comm's string.
            let p = [c.prepare(h, r, n)];
            if calls(ctx, &p, BROKEN, false).iter().all(|&rc| rc == OK[0]) {
                check(ctx, &p);
            }
        }
        End::DestroyDuring(v, c) => {
            STATS.breaks.fetch_add((r == *v) as u64, SeqCst);
            if r == *v {
                call(ctx, Call::Destroy(h), OK);
            } else {
                calls(ctx, &[c.prepare(h, r, n)], &[strataRemoteError], true);
            }
        }
        End::GroupDestroy(c) => {
            STATS.breaks.fetch_add((r == 0) as u64, SeqCst);
            let p = [c.prepare(h, r, n)];
            group(ctx, 1, true);
            calls(ctx, &p, OK, true);
            call(ctx, Call::Destroy(h), OK);
            call(
                ctx,
                Call::GroupEnd,
                &[strataInvalidUsage, strataRemoteError],
            );
        }
        End::Abandon(mask, c) => {
            if mask >> (r % 32) & 1 == 1 {
                let p = [c.prepare(h, r, n)];
                group(ctx, 1, true);
                calls(ctx, &p, OK, true);
                call(ctx, Call::Destroy(h), OK);
                // The thread ends inside the group; `p` is dropped with the group held.
                std::mem::drop(p);
            } else {
                call(ctx, Call::Destroy(h), OK);
            }
        }
    }
}

/// After the end event: every handle is released; using one again is usage.
fn after_end(ctx: &Ctx, sh: &Shared, e: &Env) {
    let h = e.h;
    match &sh.w.end {
        End::AbortDuring(v, ..) if e.rank == *v => {
            call(ctx, Call::Destroy(h), USAGE);
        }
        End::AbortDuring(..) => {
            call(ctx, Call::Destroy(h), &[strataSuccess, strataRemoteError]);
        }
        End::DestroyDuring(v, _) if e.rank != *v => {
            call(ctx, Call::Destroy(h), &[strataSuccess, strataRemoteError]);
        }
        _ => {
            call(ctx, Call::Destroy(h), USAGE);
        }
    }
    let mut x: c_int = 0;
    call(ctx, Call::Count(h, &mut x), USAGE);
}
