//! The transport-independent self test (`strata_tools::selftest::exercise`) on the
//! local transport over many shapes; `examples/mpi_check.rs` runs the same body under
//! mpirun.
#[path = "../../tests/common/mod.rs"]
mod common;

use strata_tools::selftest::exercise;

#[test]
fn exercise_nodes_2x4() {
    common::all_ok("nodes:2x4", |c| exercise(&c));
}

#[test]
fn exercise_frontier_1() {
    common::all_ok("frontier:1", |c| exercise(&c));
}

#[test]
fn exercise_three_nodes_of_two_packages_of_two() {
    common::all_ok("nodes:3x2x2", |c| exercise(&c));
}

#[test]
fn exercise_one_rank() {
    common::all_ok("nodes:1x1", |c| exercise(&c));
}

#[test]
fn exercise_one_node() {
    common::all_ok("nodes:1x3", |c| exercise(&c));
}

#[test]
fn exercise_one_rank_per_node() {
    common::all_ok("nodes:3x1", |c| exercise(&c));
}

#[test]
fn exercise_frontier_2() {
    common::all_ok("frontier:2", |c| exercise(&c));
}
