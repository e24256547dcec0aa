"""One name per graph on every surface: transform relations, GraphML keys, networkx
edges, statistics tables and the viewer, 0-based everywhere."""
from pathlib import Path

import torch
from torch_geometric.data import Data

import glomo_pyg.analysis.viewer as viewer_package
from glomo_pyg import GraphPredictor, PretrainedGraphPredictor
from glomo_pyg.analysis import GraphStatisticsAccumulator
from glomo_pyg.analysis.export import edge_list, to_graphml_graph
from glomo_pyg.graphs.names import layer_name, relation_name
from glomo_pyg.transforms import GlomoGraphs


def predictor():
    torch.manual_seed(0)
    parts = [GraphPredictor(num_tokens=12, hidden_channels=12, num_layers=2, heads=3,
                            direction=d, cnn_layers=1) for d in ("forward", "backward")]
    return PretrainedGraphPredictor(*parts).eval()


def test_the_name():
    assert relation_name("forward", 0, 3) == "forward/layer0/head3"
    assert relation_name("backward", 2, 1, products=True) == "backward/layers0-2/head1"
    assert layer_name(1) == "layer1"


def test_every_surface_names_a_graph_alike():
    p = predictor()
    x = torch.tensor([1, 4, 2, 7, 3])
    expected = [relation_name(d, l, h) for d in ("forward", "backward") for l in range(2)
                for h in range(3)]
    assert GlomoGraphs(p).relations == expected
    graphs = p(x)
    graphml = [to_graphml_graph(getattr(graphs, d), 0) for d in ("forward", "backward")]
    keys = {k for g in graphml for _, _, k in g.edges(keys=True)}
    relations = {a["relation"] for g in graphml for _, _, a in g.edges(data=True)}
    assert keys == relations and keys <= set(expected)  # (a graph may have no edge)
    listed = [relation_name(g["direction"], g["layer"], g["head"])
              for d in ("forward", "backward") for g in edge_list(getattr(graphs, d), 0)["graphs"]]
    assert listed == expected
    for d in ("forward", "backward"):
        nx_graph = getattr(graphs, d).to_networkx(0)
        for _, _, (layer, head), attributes in nx_graph.edges(keys=True, data=True):
            assert attributes["relation"] == relation_name(d, layer, head)
            assert (attributes["layer"], attributes["head"]) == (layer, head)
    table = GraphStatisticsAccumulator().update(graphs.forward).update(graphs.backward).table()
    text = table.format()
    assert all(f"| {name} |" in text for name in expected)
    assert "fw L" not in text


def test_the_viewer_numbers_from_zero_and_captions_with_the_name():
    script = (Path(viewer_package.__file__).parent / "viewer.js").read_text()
    assert '"/layer" + l + "/head" + h' in script
    assert "(l + 1)" not in script and "(h + 1)" not in script
    assert '"layer " + l' in script


def test_a_merged_transform_names_its_directions():
    assert GlomoGraphs(predictor(), merge="mean").relations == ["forward", "backward"]
    assert GlomoGraphs(predictor(), products=True, layers=[1], heads=[0]).relations == [
        "forward/layers0-1/head0", "backward/layers0-1/head0"]
    data = GlomoGraphs(predictor())(Data(x=torch.tensor([1, 2, 3])))
    assert int(data.edge_type.max()) < 12
