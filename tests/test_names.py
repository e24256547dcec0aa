"""One name per graph on every surface (transform relations, GraphML keys and attributes,
networkx edges, statistics tables, figures, the viewer's data and the labels its script
shows), layers and heads counted from 0 everywhere; and docs/analysis.md's read-back of
``glomo export``'s files runs against real output."""
import json
import re
import shutil
import subprocess
from pathlib import Path

import networkx as nx
import pytest
import torch
from torch_geometric.data import Data

import glomo_pyg.analysis.viewer as viewer_package
from glomo_pyg import GraphPredictor, PretrainedGraphPredictor
from glomo_pyg.analysis import GraphStatisticsAccumulator, view_data
from glomo_pyg.analysis.export import edge_list, to_graphml_graph
from glomo_pyg.analysis.export_files import ExportItem, export_graphs
from glomo_pyg.analysis.viewer.page import render
from glomo_pyg.cli import main
from glomo_pyg.data.text import SPECIALS
from glomo_pyg.graph_names import layer_name, relation_name
from glomo_pyg.nn.pixel import PixelGraphPredictor
from glomo_pyg.transforms import GlomoGraphs

ROOT = Path(__file__).resolve().parent.parent
WORDS = ["the", "cat", "sat", "on", "a", "mat"]
DIRECTIONS = ("forward", "backward")


def predictor(layers=2, heads=3):
    torch.manual_seed(0)
    parts = [GraphPredictor(num_tokens=len(SPECIALS) + len(WORDS), hidden_channels=12,
                            num_layers=layers, heads=heads, direction=d, cnn_layers=1)
             for d in DIRECTIONS]
    return PretrainedGraphPredictor(*parts, list(SPECIALS) + WORDS).eval()


def pixel_predictor():
    torch.manual_seed(0)
    return PretrainedGraphPredictor(*[
        PixelGraphPredictor(4, 4, hidden_channels=8, num_layers=2, heads=2, cnn_layers=1,
                            direction=d).eval() for d in DIRECTIONS])


def names(layers=2, heads=3, products=False):
    return [relation_name(d, l, h, products) for d in DIRECTIONS for l in range(layers)
            for h in range(heads)]


def test_the_name():
    assert relation_name("forward", 0, 3) == "forward/layer0/head3"
    assert relation_name("backward", 2, 1, products=True) == "backward/layers0-2/head1"
    assert layer_name(1) == "layer1" and layer_name(2, products=True) == "layers0-2"


def test_transforms_graphml_networkx_and_statistics_name_a_graph_alike(tmp_path):
    p = predictor()
    assert GlomoGraphs(p).relations == names()
    assert GlomoGraphs(p, products=True).relations == names(products=True)
    assert GlomoGraphs(p, merge="mean").relations == list(DIRECTIONS)
    data = GlomoGraphs(p)(Data(x=torch.tensor([4, 5, 6, 7, 8])))
    assert int(data.edge_type.max()) < len(names())
    graphs = p(torch.tensor([4, 5, 6, 7, 8]))
    listed = [relation_name(g["direction"], g["layer"], g["head"])
              for g in edge_list(graphs, 0)["graphs"]]
    assert listed == names()
    # GraphML, written and read back: keys, relation attributes and numbers agree
    nx.write_graphml(to_graphml_graph(graphs, 0), tmp_path / "g.graphml")
    back = nx.read_graphml(tmp_path / "g.graphml", node_type=int, force_multigraph=True)
    seen = set()
    for _, _, key, a in back.edges(keys=True, data=True):
        assert key == a["relation"] == relation_name(a["direction"], a["layer"], a["head"])
        seen.add(key)
    assert seen <= set(names()) and len(seen) > 1
    for d in DIRECTIONS:  # networkx: the same keys and attributes
        for _, _, key, a in getattr(graphs, d).to_networkx(0).edges(keys=True, data=True):
            assert key == a["relation"] == relation_name(d, a["layer"], a["head"])
            assert a["direction"] == d
    table = GraphStatisticsAccumulator().update(graphs).table()
    assert [r.relation for r in table.rows] == names()
    assert all(f"| {name} |" in table.format() for name in names())
    assert [line.split(",")[0] for line in table.to_csv().splitlines()[1:]] == names()
    assert [r["relation"] for r in table.to_dict()["rows"]] == names()


def test_the_viewer_data_hold_the_names():
    data = view_data(predictor(), "the cat sat on a mat")
    for d in DIRECTIONS:
        part = data["directions"][d]
        assert part["names"] == [[relation_name(d, l, h) for h in range(3)] for l in range(2)]
        assert part["product_names"] == [[relation_name(d, l, h, True) for h in range(3)]
                                         for l in range(2)]


def shown_labels(tmp_path, data):
    """The labels viewer.js shows for ``data``, run in Node against a minimal DOM."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("no Node.js here to run the viewer's script")
    (tmp_path / "data.json").write_text(json.dumps(data))
    script = Path(viewer_package.__file__).parent / "viewer.js"
    out = subprocess.run([node, str(ROOT / "tests" / "viewer_dom.js"), str(script),
                          str(tmp_path / "data.json")], capture_output=True, text=True,
                         timeout=60, check=True)
    return json.loads(out.stdout)


def test_the_viewer_shows_the_names_counted_from_zero(tmp_path):
    data = view_data(predictor(), "the cat sat on a mat")
    assert "forward/layer0/head0" in render(data)
    labels = shown_labels(tmp_path, data)
    assert labels["layers"] == ["layer0", "layer1", "layers0-1 (chained)"]
    assert labels["heads"] == ["head0", "head1", "head2"]
    forward = [relation_name("forward", l, h) for l in range(2) for h in range(3)]
    assert labels["captions"] == forward and labels["labels"] == forward
    image = torch.randint(0, 256, (3, 4, 4), dtype=torch.uint8)
    labels = shown_labels(tmp_path, view_data(pixel_predictor(), image=image))
    assert labels["layers"] == ["layer0", "layer1"] and labels["heads"] == ["head0", "head1"]
    assert labels["captions"] == [relation_name("forward", l, h) for l in range(2)
                                  for h in range(2)]


def docs_read_back():
    """docs/analysis.md's read-back snippet of ``glomo export``'s files."""
    text = (ROOT / "docs" / "analysis.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "read_graphml" in b]
    assert len(blocks) == 1, "docs/analysis.md should hold one read-back snippet"
    return blocks[0]


def test_the_docs_read_back_runs_against_real_export_output(tmp_path, monkeypatch):
    p = predictor()
    items = [ExportItem(p.encode(s.split()), f"s{k}", s.split())
             for k, s in enumerate(["the cat sat", "a mat"])]
    export_graphs(p, items, str(tmp_path / "graphs"))
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(docs_read_back(), "docs/analysis.md", "exec"), scope)
    assert scope["names"] <= set(names()) and scope["names"]
    assert [relation_name(g["direction"], g["layer"], g["head"]) for g in scope["edges"]] \
        == names()
    assert scope["files"] == ["sample_00000.json", "sample_00000.graphml"]
    # every file name the export section names is one export_graphs wrote
    section = (ROOT / "docs" / "analysis.md").read_text().split("## Export to files")[1] \
        .split("\n## ")[0]
    written = set(p.name for p in (tmp_path / "graphs").iterdir())
    named = set(re.findall(r"[a-z_0-9]+\.(?:graphml|json|csv|md)\b", section)) - {"analysis.md"}
    assert named and named <= written, named - written
    assert "sample_<k>.graphml" in section and "sample_00000.graphml" in section


def test_glomo_export_writes_the_files_the_docs_read(tmp_path, monkeypatch):
    predictor().save_pretrained(tmp_path / "pred")
    (tmp_path / "reviews.txt").write_text("the cat sat\na mat\n")
    monkeypatch.chdir(tmp_path)
    assert main(["export", "--predictor", "pred", "--text", "reviews.txt", "--output",
                 "graphs/"]) == 0
    scope: dict = {}
    exec(compile(docs_read_back(), "docs/analysis.md", "exec"), scope)
    assert scope["names"] <= set(names()) and scope["names"]
