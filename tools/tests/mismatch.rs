//! Collective mismatch detection end to end (`strata_tools::mismatch::exercise`) on the
//! local transport at 3 and 4 ranks; `examples/mpi_mismatch.rs` runs the same body
//! under mpirun.
#[path = "../../tests/common/mod.rs"]
mod common;

use strata::Comm;
use strata_tools::mismatch::exercise;

fn checked(c: Comm) -> strata::Result<usize> {
    c.set_check(true);
    exercise(&c)
}

#[test]
fn every_kind_caught_on_three_ranks() {
    assert!(common::all_ok("nodes:3x1", checked).iter().all(|&k| k == 8));
}

#[test]
fn every_kind_caught_on_four_ranks_of_two_nodes() {
    assert!(common::all_ok("nodes:2x2", checked).iter().all(|&k| k == 8));
}

#[test]
fn refuses_to_run_unchecked() {
    for r in common::on_local("nodes:1x3", |c| exercise(&c)) {
        let e = r.expect_err("ran without checking");
        assert!(e.to_string().contains("STRATA_DEBUG=check"), "{e}");
    }
}

#[test]
fn matched_calls_with_checking_on_give_exact_results() {
    common::all_ok("nodes:2x4", |c| {
        c.set_check(true);
        strata_tools::selftest::exercise(&c)
    });
}
