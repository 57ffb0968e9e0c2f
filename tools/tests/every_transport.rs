//! The transport-independent self test (`strata_tools::selftest::exercise`) on the
//! local transport over many shapes; `examples/mpi_check.rs` runs the same body under
//! mpirun.
#[path = "../../tests/common/mod.rs"]
mod common;

use strata_tools::selftest::exercise;

/// One test per topology, each running the whole self test on every rank.
macro_rules! exercise_on {
    ($($name:ident: $topology:literal,)*) => {
        $(
            #[test]
            fn $name() {
                common::all_ok($topology, |c| exercise(&c));
            }
        )*
    };
}

exercise_on! {
    exercise_nodes_2x4: "nodes:2x4",
    exercise_frontier_1: "frontier:1",
    exercise_three_nodes_of_two_packages_of_two: "nodes:3x2x2",
    exercise_one_rank: "nodes:1x1",
    exercise_one_node: "nodes:1x3",
    exercise_one_rank_per_node: "nodes:3x1",
    exercise_frontier_2: "frontier:2",
}
