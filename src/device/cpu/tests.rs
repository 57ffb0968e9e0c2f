//! The CPU device's unit tests.

use super::memory::ALIGN;
use super::*;
use crate::device::Elementwise;
use crate::dtype::{DataType, ReduceOp};
use std::time::Duration;

fn dev() -> Arc<CpuDevice> {
    CpuDevice::open(7).unwrap()
}

fn sync(s: &dyn DevStream) {
    crate::device::finish(s, Duration::from_secs(10), "test", || Ok(())).unwrap();
}

#[test]
fn copies_and_reductions_run_in_stream_order() {
    let d = dev();
    let s = d.new_stream().unwrap();
    let a = d.alloc_zeroed(16).unwrap();
    let b = d.alloc_zeroed(16).unwrap();
    let one: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    d.htod(a, &one).unwrap();
    s.delay(Duration::from_millis(30)).unwrap();
    s.copy(b, a, 16).unwrap();
    s.elementwise(Elementwise::Reduce {
        acc: b,
        src: a,
        count: 4,
        dtype: DataType::F32,
        op: ReduceOp::Sum,
    })
    .unwrap();
    assert!(
        !s.query().unwrap(),
        "enqueueing returned before the delay ran"
    );
    sync(s.as_ref());
    let mut out = [0u8; 16];
    d.dtoh(&mut out, b).unwrap();
    let v: Vec<f32> = out
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(v, [2.0, 4.0, 6.0, 8.0]);
    // SAFETY: allocated above, freed once, the stream is idle.
    unsafe {
        d.free(a);
        d.free(b);
    }
}

#[test]
fn out_of_bounds_and_freed_addresses_are_device_errors() {
    let d = dev();
    let s = d.new_stream().unwrap();
    let a = d.alloc_zeroed(64).unwrap();
    s.copy(a + 32, a, 64).unwrap();
    let e = crate::device::finish(s.as_ref(), Duration::from_secs(10), "t", || Ok(())).unwrap_err();
    assert!(e.to_string().contains("illegal address"), "{e}");
    // Sticky: later work fails too.
    assert!(s.query().is_err());
    assert!(d.check_pointer(a, 64).is_ok());
    assert!(d.check_pointer(a + 8, 64).is_err());
    // SAFETY: allocated above, freed once.
    unsafe { d.free(a) };
    assert!(d.check_pointer(a, 1).is_err());
}

#[test]
#[cfg_attr(miri, ignore = "megabyte copies; a race needs real overlap in time")]
fn a_missing_wait_between_streams_is_a_race_and_a_wait_orders_them() {
    let d = dev();
    const MB: usize = 1 << 20;
    let a = d.alloc_zeroed(MB).unwrap();
    let b = d.alloc_zeroed(MB).unwrap();
    // s1 writes `a` over and over; s2 reads it with no wait between them. The check
    // sees accesses that overlap in time, so a loaded machine may miss one round:
    // rounds with long windows (s1's copies outlast s2's delay by tens of ms) must
    // catch it; the first caught round ends the loop.
    let mut caught = None;
    for _ in 0..20 {
        let (s1, s2) = (d.new_stream().unwrap(), d.new_stream().unwrap());
        for _ in 0..512 {
            s1.copy(a, b, MB).unwrap();
        }
        s2.delay(Duration::from_millis(2)).unwrap();
        for _ in 0..128 {
            s2.copy(b + MB as u64 / 2, a, MB / 2).unwrap();
        }
        let r1 = crate::device::finish(s1.as_ref(), Duration::from_secs(60), "t", || Ok(()));
        let r2 = crate::device::finish(s2.as_ref(), Duration::from_secs(60), "t", || Ok(()));
        if let Err(e) = r1.and(r2) {
            caught = Some(e);
            break;
        }
    }
    let e = caught.expect("twenty rounds of unordered streams, no race caught");
    assert!(e.to_string().contains("race between streams"), "{e}");
    // Ordered by a wait: never an error.
    let (s1, s2) = (d.new_stream().unwrap(), d.new_stream().unwrap());
    for _ in 0..16 {
        s1.copy(a, b, MB).unwrap();
    }
    // SAFETY: s1 is a live stream of this device.
    unsafe { s2.wait_foreign(s1.raw()).unwrap() };
    s2.copy(b, a, MB).unwrap();
    sync(s2.as_ref());
    assert!(s1.query().unwrap());
    // SAFETY: allocated above, freed once, streams idle.
    unsafe {
        d.free(a);
        d.free(b);
    }
}

#[test]
fn allocations_are_counted_and_foreign_streams_checked() {
    // A device of its own: tests running at once on device 0 allocate too.
    let d = CpuDevice::open(77).unwrap();
    let before = d.allocations();
    let a = d.alloc_zeroed(10).unwrap();
    assert_eq!(d.alloc_zeroed(0).unwrap(), 0);
    assert_eq!(d.allocations(), before + 1);
    let s = d.new_stream().unwrap();
    // SAFETY: an arbitrary non-null value is looked up, never dereferenced.
    let e = unsafe { s.wait_foreign(16 as *mut c_void) }.unwrap_err();
    assert!(e.to_string().contains("not a live stream"), "{e}");
    // SAFETY: allocated above, freed once.
    unsafe { d.free(a) };
}
/// A capture records instead of running; joined streams fork and join with events;
/// the graph replays; allocating, querying, waiting outside the capture and leaving
/// a forked stream unjoined are errors, as on CUDA.
#[test]
fn capture_records_and_replays_and_refuses_what_cuda_refuses() {
    // Its own device: a capture forbids allocations device-wide.
    let d = CpuDevice::open(41).unwrap();
    let (a, b, c) = (
        d.alloc_zeroed(16).unwrap(),
        d.alloc_zeroed(16).unwrap(),
        d.alloc_zeroed(16).unwrap(),
    );
    d.htod(a, &[1u8; 16]).unwrap();
    let (s, t) = (d.new_stream().unwrap(), d.new_stream().unwrap());
    s.begin_capture().unwrap();
    assert!(s.is_capturing().unwrap());
    s.copy(b, a, 16).unwrap();
    let fork = s.record().unwrap();
    t.wait_event(fork.as_ref()).unwrap();
    assert!(
        t.is_capturing().unwrap(),
        "waiting on a captured event joins"
    );
    t.copy(c, b, 16).unwrap();
    s.wait_event(t.record().unwrap().as_ref()).unwrap();
    let g = s.end_capture().unwrap();
    assert!(!t.is_capturing().unwrap());
    let mut out = [0u8; 16];
    d.dtoh(&mut out, c).unwrap();
    assert_eq!(out, [0u8; 16], "capture ran the work");
    g.launch(s.as_ref()).unwrap();
    sync(s.as_ref());
    d.dtoh(&mut out, c).unwrap();
    assert_eq!(out, [1u8; 16], "replay did not run the work");
    d.htod(a, &[7u8; 16]).unwrap();
    g.launch(t.as_ref()).unwrap();
    sync(t.as_ref());
    d.dtoh(&mut out, c).unwrap();
    assert_eq!(out, [7u8; 16], "a replay reads the inputs of its time");

    // Allocating inside a capture fails and invalidates it.
    s.begin_capture().unwrap();
    let e = d.alloc_zeroed(8).unwrap_err();
    assert!(e.to_string().contains("being captured"), "{e}");
    let e = s.end_capture().err().expect("invalidated");
    assert!(e.to_string().contains("invalidated"), "{e}");
    // Querying a capturing stream, likewise.
    s.begin_capture().unwrap();
    assert!(s.query().is_err());
    assert!(s.end_capture().is_err());
    // A forked stream not joined back.
    s.begin_capture().unwrap();
    t.wait_event(s.record().unwrap().as_ref()).unwrap();
    t.copy(c, a, 16).unwrap();
    let e = s.end_capture().err().expect("unjoined");
    assert!(e.to_string().contains("not joined back"), "{e}");
    // Waiting for work outside the capture (isolation).
    let u = d.new_stream().unwrap();
    u.copy(b, a, 16).unwrap();
    s.begin_capture().unwrap();
    assert!(s.wait_event(u.record().unwrap().as_ref()).is_err());
    assert!(s.end_capture().is_err());
    sync(u.as_ref());
    // SAFETY: allocated above, freed once, no work left on them.
    unsafe {
        d.free(a);
        d.free(b);
        d.free(c);
    }
}

/// Every host wait for the device is counted inside a launch; enqueueing, recording
/// and querying are not waits.
#[test]
fn host_waits_inside_a_launch_are_counted() {
    use crate::device::waits;
    let d = dev();
    let a = d.alloc_zeroed(64).unwrap();
    let b = d.alloc_zeroed(64).unwrap();
    // The synchronous copies use memory of their own (they wait for no stream).
    let c = d.alloc_zeroed(64).unwrap();
    let s = d.new_stream().unwrap();
    let mut out = [0u8; 64];
    {
        let _l = waits::launching();
        let before = waits::thread_count();
        s.copy(b, a, 64).unwrap();
        s.clear(a, 8).unwrap();
        let ev = s.record().unwrap();
        let _ = ev.query().unwrap();
        let _ = s.query().unwrap();
        assert_eq!(
            waits::thread_count(),
            before,
            "enqueueing and recording waited"
        );
        d.dtoh(&mut out, c).unwrap();
        assert_eq!(
            waits::thread_count(),
            before + 1,
            "a synchronous dtoh was not counted"
        );
        assert!(waits::last().is_some());
        d.htod(c, &[1u8; 8]).unwrap();
        d.zero(c, 8).unwrap();
        assert_eq!(
            waits::thread_count(),
            before + 3,
            "htod / zero were not counted"
        );
    }
    // Outside a launch nothing counts.
    let before = waits::thread_count();
    sync(s.as_ref());
    d.dtoh(&mut out, b).unwrap();
    assert_eq!(waits::thread_count(), before);
    // SAFETY: allocated above, freed once, the stream is idle.
    unsafe {
        d.free(a);
        d.free(b);
        d.free(c);
    }
}

/// `bind` makes the device current until its guard drops, restoring the thread's
/// previous device (nested guards in order); other threads are untouched.
#[test]
fn nested_binds_restore_the_current_device_in_order() {
    set_current_device(None);
    assert_eq!(current_device(), None);
    set_current_device(Some(3));
    let (d0, d1) = (CpuDevice::open(0).unwrap(), CpuDevice::open(1).unwrap());
    {
        let _outer = d0.bind().unwrap();
        assert_eq!(current_device(), Some(0));
        {
            let _inner = d1.bind().unwrap();
            assert_eq!(current_device(), Some(1));
            std::thread::spawn(|| assert_eq!(current_device(), None))
                .join()
                .unwrap();
        }
        assert_eq!(current_device(), Some(0));
    }
    assert_eq!(current_device(), Some(3));
    set_current_device(None);
    {
        let _g = d1.bind().unwrap();
    }
    assert_eq!(current_device(), None);
}

/// Memory of several mappings (`expandable_segments`): a range over adjacent
/// mappings is device memory for `check_pointer` and for operations; past the last
/// mapping it is not; `free_mapped` frees every mapping; `free` and `free_mapped`
/// refuse each other's memory.
#[test]
fn memory_of_several_mappings() {
    // Its own device: the test frees memory and checks it is gone.
    const ORD: usize = 43;
    let d = CpuDevice::open(ORD).unwrap();
    let before = d.live_bytes();
    let m = alloc_mapped(ORD, &[256, 512, 256]).unwrap();
    assert_eq!(m % ALIGN as u64, 0);
    assert_eq!(d.live_bytes(), before + 1024);
    d.check_pointer(m, 1024).unwrap();
    d.check_pointer(m + 100, 800).unwrap();
    d.check_pointer(m + 768, 256).unwrap();
    let e = d.check_pointer(m, 1025).unwrap_err();
    assert!(e.to_string().contains("run past the end"), "{e}");
    let e = d.check_pointer(m + 300, 1024).unwrap_err();
    assert!(e.to_string().contains("run past the end"), "{e}");
    assert!(alloc_mapped(ORD, &[]).is_err());
    assert!(alloc_mapped(ORD, &[256, 0]).is_err());

    // A copy on a stream spanning the first two mappings, into the last two.
    let pattern: Vec<u8> = (0..1024u32).map(|i| (i * 7 % 251) as u8).collect();
    d.htod(m, &pattern).unwrap();
    let s = d.new_stream().unwrap();
    let plain = d.alloc_zeroed(600).unwrap();
    s.copy(plain, m + 100, 600).unwrap();
    s.copy(m + 400, plain, 600).unwrap();
    sync(s.as_ref());
    let mut out = vec![0u8; 1024];
    d.dtoh(&mut out, m).unwrap();
    assert_eq!(out[400..1000], pattern[100..700]);
    assert_eq!(out[..400], pattern[..400]);
    assert_eq!(out[1000..], pattern[1000..]);

    // `free` refuses mapped memory (as cuMemFree), `free_mapped` plain memory.
    // SAFETY: `m + 256` is not an allocation of `alloc_zeroed`: refused, nothing freed.
    unsafe { d.free(m + 256) };
    // SAFETY: as above, `m` is mapped memory: refused.
    unsafe { d.free(m) };
    d.check_pointer(m, 1024).unwrap();
    assert!(free_mapped(ORD, plain).is_err());
    assert!(free_mapped(ORD, m + 256).is_err());

    free_mapped(ORD, m).unwrap();
    assert_eq!(d.live_bytes(), before + 600);
    assert!(d.check_pointer(m, 1).is_err());
    assert!(d.check_pointer(m + 512, 1).is_err());
    s.copy(plain, m + 256, 64).unwrap();
    let e = crate::device::finish(s.as_ref(), Duration::from_secs(10), "t", || Ok(())).unwrap_err();
    assert!(e.to_string().contains("illegal address"), "{e}");
    assert!(free_mapped(ORD, m).is_err(), "freed twice");
    // SAFETY: allocated above, freed once; the failed stream holds no access.
    unsafe { d.free(plain) };
    assert_eq!(d.live_bytes(), before);
}
