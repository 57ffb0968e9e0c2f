use super::*;
use crate::capi::coll::strataAllReduce;
use crate::capi::init::{strataCommDestroy, strataCommInitLocal};
use std::ptr::{null, null_mut};

/// Calls observed through events alone (`async_op=True`, the torch backend) leave
/// nothing behind on their stream: its list of unobserved calls stays at the ones
/// in flight, where it once grew by one entry per call (and every event record
/// copied all of it).
#[test]
fn calls_seen_through_events_do_not_pile_up() {
    let mut comm: strataComm_t = null_mut();
    let (mut stream, mut ev): (strataStream_t, strataEvent_t) = (null_mut(), null_mut());
    // SAFETY: out-pointers to locals; one rank, no topology, default config.
    unsafe {
        assert_eq!(
            strataCommInitLocal(&mut comm, 1, null(), null()),
            strataSuccess
        );
        assert_eq!(strataStreamCreate(&mut stream), strataSuccess);
        assert_eq!(strataEventCreate(&mut ev), strataSuccess);
    }
    let mut buf = [1.0f32, 2.0, 3.0, 4.0];
    for _ in 0..50 {
        let p = buf.as_mut_ptr().cast::<c_void>();
        // SAFETY: `buf` stays alive and untouched until the event is synchronized.
        unsafe {
            assert_eq!(
                strataAllReduce(p, p, 4, strataFloat32, strataSum, comm, stream),
                strataSuccess
            );
            assert_eq!(strataEventRecord(ev, stream), strataSuccess);
            assert_eq!(strataEventSynchronize(ev), strataSuccess);
        }
    }
    let s = STREAMS.find(stream).unwrap();
    let left = lock(&s.state).pending.len();
    assert!(left <= 1, "{left} calls kept after 50 observed ones");
    assert_eq!(lock(&s.state).tail.len(), 1);
    assert_eq!(buf, [1.0, 2.0, 3.0, 4.0], "one rank's sum is its input");
    // SAFETY: handles made above, destroyed once.
    unsafe {
        assert_eq!(strataEventDestroy(ev), strataSuccess);
        assert_eq!(strataStreamDestroy(stream), strataSuccess);
        assert_eq!(strataCommDestroy(comm), strataSuccess);
    }
}
