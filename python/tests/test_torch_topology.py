"""strata.torch.group_topology: the topology a GPU group's own communicator gets from the
world's STRATA_TOPOLOGY (run by scripts/torch-check, where torch is installed)."""

import json

import pytest

st = pytest.importorskip("strata.torch")


@pytest.mark.parametrize(
    "spec,world,ranks,want",
    [
        (None, 8, [0, 1], None),  # unset: the nccl transport detects nodes by host
        ("nodes:2x4", 8, range(8), None),  # the world itself
        ("nodes:2x4", 8, [0, 1, 2, 3], "nodes:1x4"),  # one node's ranks
        ("nodes:2x4", 8, [1, 5], "nodes:2x1"),  # a rail across the two nodes
        ("nodes:4x2", 8, [0, 1, 4, 5], "nodes:2x2"),  # whole nodes 0 and 2
        ("nodes:2x2x2", 8, [4, 5, 6, 7], "nodes:1x2x2"),  # whole node keeps its packages
        ("nodes:2x2x2", 8, [0, 1, 4, 5], "nodes:2x2"),  # half nodes: flat inside
        ("dgx-h100:4", 32, range(8, 24), "dgx-h100:2"),  # whole nodes of a preset
        ("frontier:2,switch=1", 16, range(8), "frontier:1"),
        ("dgx-a100:2", 16, [0, 8], "nodes:2x1"),
        ("nodes:2x4", 8, [0, 1, 2, 4], "nodes:1x4"),  # uneven: one flat node
        ("nodes:2x4", 8, [4, 0], "nodes:1x2"),  # not in rank order: flat
    ],
)
def test_group_topology(spec, world, ranks, want):
    assert st.group_topology(spec, world, list(ranks)) == want


def test_group_topology_of_a_file_and_a_bad_spec(tmp_path):
    f = tmp_path / "topo.json"
    f.write_text(json.dumps({"nodes": 2, "packages_per_node": 4, "dies_per_package": 2}))
    assert st.group_topology(str(f), 16, list(range(8, 16))) == "nodes:1x4x2"
    with pytest.raises(RuntimeError, match="STRATA_TOPOLOGY"):
        st.group_topology("mesh:3", 8, [0, 1])
