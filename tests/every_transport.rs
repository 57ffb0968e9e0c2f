//! The transport-independent self test (`strata::check::exercise`) on the local
//! transport over many shapes; the MPI examples run the same body under mpirun.
mod common;

#[test]
fn exercise_nodes_2x4() {
    common::all_ok("nodes:2x4", |c| strata::check::exercise(&c));
}

#[test]
fn exercise_frontier_1() {
    common::all_ok("frontier:1", |c| strata::check::exercise(&c));
}

#[test]
fn exercise_three_nodes_of_two_packages_of_two() {
    common::all_ok("nodes:3x2x2", |c| strata::check::exercise(&c));
}

#[test]
fn exercise_one_rank() {
    common::all_ok("nodes:1x1", |c| strata::check::exercise(&c));
}

#[test]
fn exercise_one_node() {
    common::all_ok("nodes:1x3", |c| strata::check::exercise(&c));
}

#[test]
fn exercise_one_rank_per_node() {
    common::all_ok("nodes:3x1", |c| strata::check::exercise(&c));
}

#[test]
fn exercise_frontier_2() {
    common::all_ok("frontier:2", |c| strata::check::exercise(&c));
}
