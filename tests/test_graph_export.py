"""networkx export and explicit hierarchical (Lambda) matrices of LatentGraphs."""
import networkx as nx
import pytest
import torch
from reference import batch_vector

from glomo_pyg import GraphPredictor

LENGTHS = [6, 1, 9]


def _graphs():
    model = GraphPredictor(num_tokens=20, hidden_channels=16, num_layers=3, heads=2,
                           cnn_layers=1).double().eval()
    with torch.no_grad():
        return model(torch.randint(0, 20, (sum(LENGTHS),)), batch_vector(LENGTHS))


def test_digraph_weights_match_the_tensors_and_labels_are_attached():
    graphs = _graphs()
    dense = graphs.to_dense()  # [L, B, H, T, T]
    labels = [f"tok{t}" for t in range(9)]
    g = graphs.to_networkx(2, layer=1, head=0, labels=labels)
    assert isinstance(g, nx.DiGraph) and not g.is_multigraph()
    assert g.number_of_nodes() == 9
    assert [g.nodes[t]["label"] for t in range(9)] == labels
    assert g.number_of_edges() == int((dense[1, 2, 0] > 0).sum())
    for i, j, w in g.edges(data="weight"):
        assert i < j
        assert w == pytest.approx(float(dense[1, 2, 0, i, j]))
    # networkx algorithms run on the result
    assert nx.is_directed_acyclic_graph(g)
    assert len(nx.pagerank(g)) == 9


def test_multigraph_is_keyed_by_the_graphs_name():
    graphs = _graphs()
    dense = graphs.to_dense()
    g = graphs.to_networkx(0)
    assert isinstance(g, nx.MultiDiGraph)
    assert g.number_of_edges() == int((dense[:, 0] > 0).sum())
    for i, j, key, a in g.edges(keys=True, data=True):
        layer, head = a["layer"], a["head"]
        assert key == a["relation"] == f"{graphs.direction}/layer{layer}/head{head}"
        assert a["direction"] == graphs.direction
        assert a["weight"] == pytest.approx(float(dense[layer, 0, head, i, j]))
    one_layer = graphs.to_networkx(0, layer=2)
    assert {a for _, _, a in one_layer.edges(data="layer")} <= {2}
    single = graphs.to_networkx(0, layer=1, head=0)
    assert {a for _, _, a in single.edges(data="relation")} == {"forward/layer1/head0"}
    lone = graphs.to_networkx(1, layer=0, head=1)  # a length-1 sequence: one node, no edges
    assert lone.number_of_nodes() == 1 and lone.number_of_edges() == 0


def test_hierarchical_matrices_equal_dense_products():
    graphs = _graphs()
    dense = graphs.to_dense()
    for head in range(2):
        expected = dense[0, 2, head, :9, :9]
        for layer in range(3):
            if layer:
                expected = expected @ dense[layer, 2, head, :9, :9]
            got = graphs.hierarchical(2, layer, head).to_dense()
            torch.testing.assert_close(got, expected)


def test_export_rejects_bad_arguments():
    graphs = _graphs()
    with pytest.raises(ValueError, match="sample"):
        graphs.to_networkx(3, layer=0, head=0)
    with pytest.raises(ValueError, match="layer"):
        graphs.to_networkx(0, layer=3, head=0)
    with pytest.raises(ValueError, match="head"):
        graphs.adjacency(0, 0, 2)
    with pytest.raises(ValueError, match="labels"):
        graphs.to_networkx(0, layer=0, head=0, labels=["a", "b"])
