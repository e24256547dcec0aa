"""GraphML / JSON edge-list export of every graph of a sample, and ``glomo export``."""
import json
import os

import networkx as nx
import numpy as np
import pytest
import torch
from reference import batch_vector

from glomo_pyg import Glomo, GraphPredictor, PretrainedGraphPredictor
from glomo_pyg.analysis import edge_list, to_graphml_graph
from glomo_pyg.analysis.export_files import ExportDirectory, ExportItem, export_graphs
from glomo_pyg.cli import main
from glomo_pyg.nn.pixel import PixelGraphPredictor

VOCAB = ["<pad>", "<unk>", "<bos>", "<eos>", "the", "cat", "sat", "on", "mat", "."]


def text_predictor():
    torch.manual_seed(0)
    model = Glomo.text(len(VOCAB), hidden_channels=16, num_layers=2, heads=2, cnn_layers=1)
    return model.to_pretrained(VOCAB).eval()


def pixel_predictor(h=4, w=5):
    torch.manual_seed(0)
    return PretrainedGraphPredictor(*[
        PixelGraphPredictor(h, w, hidden_channels=8, num_layers=1, heads=2, cnn_layers=1,
                            direction=d).eval() for d in ("forward", "backward")])


def graphs_of(predictor, lengths):
    x = torch.randint(4, len(VOCAB), (sum(lengths),))
    with torch.no_grad():
        return predictor(x, batch_vector(lengths))


def dense_of(graphs, direction, layer, sample):
    g = getattr(graphs, direction)
    t = int(g.lengths[sample])
    return g.to_dense(layer=layer)[sample, :, :t, :t]  # [H, i, j]


def test_graphml_read_back_by_networkx_equals_the_tensors(tmp_path):
    graphs = graphs_of(text_predictor(), [5, 8])
    labels = [f"w{t}" for t in range(8)]
    path = tmp_path / "g.graphml"
    nx.write_graphml(to_graphml_graph(graphs, 1, labels), path)
    back = nx.read_graphml(path, node_type=int, force_multigraph=True)
    assert sorted(back.nodes) == list(range(8))
    assert [back.nodes[t]["label"] for t in range(8)] == labels
    for direction in ("forward", "backward"):
        for layer in range(2):
            dense = dense_of(graphs, direction, layer, 1)
            rebuilt = torch.zeros_like(dense)
            for i, j, data in back.edges(data=True):
                if (data["direction"], data["layer"]) == (direction, layer):
                    rebuilt[data["head"], i, j] = data["weight"]
            assert torch.equal(rebuilt, dense)  # float32 weights survive exactly


def test_json_edge_list_equals_the_tensors_and_thins():
    graphs = graphs_of(text_predictor(), [9])
    data = json.loads(json.dumps(edge_list(graphs, 0)))
    assert data["num_units"] == 9 and len(data["graphs"]) == 2 * 2 * 2
    for part in data["graphs"]:
        dense = dense_of(graphs, part["direction"], part["layer"], 0)[part["head"]]
        rebuilt = torch.zeros_like(dense)
        rebuilt[part["source"], part["target"]] = torch.tensor(part["weight"], dtype=dense.dtype)
        assert torch.equal(rebuilt, dense)
    # thinning against a brute-force reference: top-2 per target, weight >= 0.1
    thin = edge_list(graphs, 0, min_weight=0.1, top_k=2)
    for part in thin["graphs"]:
        dense = dense_of(graphs, part["direction"], part["layer"], 0)[part["head"]]
        expected = set()
        for j in range(9):
            col = dense[:, j]
            order = sorted(range(9), key=lambda i: (-float(col[i]), i))
            expected |= {(i, j) for i in order[:2] if col[i] > 0 and col[i] >= 0.1}
        assert set(zip(part["source"], part["target"])) == expected
    with pytest.raises(ValueError, match="top_k"):
        edge_list(graphs, 0, top_k=0)
    with pytest.raises(ValueError, match="min_weight"):
        edge_list(graphs, 0, min_weight=-0.5)
    # a floor above every weight is a valid pruning that keeps nothing
    assert not any(p["source"] for p in edge_list(graphs, 0, min_weight=2.0)["graphs"])
    with pytest.raises(ValueError, match="sample"):
        edge_list(graphs, 1)
    with pytest.raises(ValueError, match="labels"):
        edge_list(graphs, 0, labels=["a"])


def test_image_units_carry_row_and_column():
    predictor = pixel_predictor()
    image = torch.randint(0, 256, (1, 3, 4, 5), dtype=torch.uint8)
    from glomo_pyg.pixels import image_units
    with torch.no_grad():
        graphs = predictor(*image_units(image))
    data = edge_list(graphs, 0)
    assert data["units"][7] == dict(position=7, row=1, column=2)


def test_export_directory_confines_paths_and_replaces_links(tmp_path):
    out = ExportDirectory(str(tmp_path / "out"))
    for bad in ("../x", "a/b", "..", ".", "", "/etc/passwd", "x\0y"):
        with pytest.raises(ValueError, match="refusing"):
            out.path(bad)
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    os.symlink(outside, tmp_path / "out" / "sample_00000.json")
    predictor = text_predictor()
    items = [ExportItem(predictor.encode("the cat sat".split()), "line 1", "the cat sat".split())]
    export_graphs(predictor, items, str(tmp_path / "out"), formats=["json"])
    assert outside.read_text() == "keep me"  # the link was replaced, not followed
    target = tmp_path / "out" / "sample_00000.json"
    assert not target.is_symlink() and json.loads(target.read_text())["source"] == "line 1"
    assert not [n for n in os.listdir(tmp_path / "out") if n.startswith(".tmp")]
    with pytest.raises(ValueError, match="not a directory"):
        ExportDirectory(str(outside))


def test_export_graphs_writes_samples_statistics_and_index(tmp_path):
    predictor = text_predictor()
    sentences = ["the cat sat on the mat .", "the mat", "cat sat"]
    items = [ExportItem(predictor.encode(s.split()), f"s{k}", s.split())
             for k, s in enumerate(sentences)]
    index = export_graphs(predictor, items, str(tmp_path), batch_size=2)
    names = sorted(os.listdir(tmp_path))
    assert names == sorted([f"sample_0000{k}.{e}" for k in range(3) for e in ("graphml", "json")]
                           + ["index.json", "statistics.csv", "statistics.json",
                              "statistics.md"])
    assert [s["num_units"] for s in index["samples"]] == [7, 2, 2]
    stats = json.loads((tmp_path / "statistics.json").read_text())
    assert stats["num_sequences"] == 3 and len(stats["rows"]) == 8
    back = nx.read_graphml(tmp_path / "sample_00000.graphml", node_type=int,
                           force_multigraph=True)
    assert back.number_of_edges() == index["samples"][0]["num_edges"]
    assert back.graph["source"] == "s0"
    with pytest.raises(ValueError, match="max_edges"):
        export_graphs(predictor, items, str(tmp_path / "small"), max_edges=3)
    with pytest.raises(ValueError, match="formats"):
        export_graphs(predictor, items, str(tmp_path), formats=["pickle"])
    with pytest.raises(ValueError, match="no items"):
        export_graphs(predictor, [], str(tmp_path))


def test_export_of_images_of_another_size_resizes_the_predictor(tmp_path):
    predictor = pixel_predictor(4, 5)
    images = [torch.randint(0, 256, (3, h, w), dtype=torch.uint8) for h, w in
              ((4, 5), (3, 3), (3, 3))]
    index = export_graphs(predictor, [ExportItem(im, f"im{k}") for k, im in enumerate(images)],
                          str(tmp_path), formats=["json"])
    assert [s["num_units"] for s in index["samples"]] == [20, 9, 9]
    data = json.loads((tmp_path / "sample_00001.json").read_text())
    assert data["units"][4] == dict(position=4, row=1, column=1)
    with torch.no_grad():
        ref = predictor.resized(3, 3)(images[1].permute(1, 2, 0).reshape(9, 3))
    part = data["graphs"][0]
    dense = ref.forward.to_dense(layer=0)[0, 0]
    assert np.allclose([float(dense[i, j]) for i, j in zip(part["source"], part["target"])],
                       part["weight"])


def test_glomo_export_command_text_and_images(tmp_path, capsys):
    pred_dir = tmp_path / "pred"
    text_predictor().save_pretrained(str(pred_dir))
    text = tmp_path / "t.txt"
    text.write_text("The cat sat on the mat.\n\nmat\nthe dog sat\n", encoding="utf-8")
    assert main(["export", "--predictor", str(pred_dir), "--text", str(text), "--output",
                 str(tmp_path / "out"), "--top-k", "1", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "1 line(s) of a single token skipped" in out and "2 sample(s)" in out
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    assert [s["source"] for s in index["samples"]] == [f"{text}:1", f"{text}:4"]
    data = json.loads((tmp_path / "out" / "sample_00001.json").read_text())
    assert [u["label"] for u in data["units"]] == ["the", "dog", "sat"]
    assert index["top_k"] == 1

    from PIL import Image
    pix_dir, img_dir = tmp_path / "pix", tmp_path / "imgs"
    pixel_predictor(4, 5).save_pretrained(str(pix_dir))
    img_dir.mkdir()
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (4, 5, 3), dtype=np.uint8)).save(img_dir / "a.png")
    Image.fromarray(rng.integers(0, 256, (4, 5), dtype=np.uint8)).save(img_dir / "b.png")
    (img_dir / "notes.txt").write_text("not an image")
    assert main(["export", "--predictor", str(pix_dir), "--images", str(img_dir), "--output",
                 str(tmp_path / "iout"), "--formats", "graphml"]) == 0
    names = sorted(os.listdir(tmp_path / "iout"))
    assert "sample_00000.graphml" in names and "sample_00001.graphml" in names
    assert not [n for n in names if n.endswith(".json") and n.startswith("sample")]


def test_glomo_export_command_refuses_bad_input(tmp_path):
    pred_dir, pix_dir = tmp_path / "pred", tmp_path / "pix"
    text_predictor().save_pretrained(str(pred_dir))
    pixel_predictor().save_pretrained(str(pix_dir))
    binary = tmp_path / "b.txt"
    binary.write_bytes(b"\xff\xfe\x00bad")
    empty = tmp_path / "e.txt"
    empty.write_text("\n\n")
    big = tmp_path / "big"
    big.mkdir()
    from PIL import Image
    Image.fromarray(np.zeros((80, 80, 3), dtype=np.uint8)).save(big / "x.png")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "x.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    out = str(tmp_path / "o")
    cases = [
        (["--predictor", str(pred_dir), "--text", str(binary)], "not UTF-8"),
        (["--predictor", str(pred_dir), "--text", str(empty)], "no input"),
        (["--predictor", str(pred_dir), "--text", str(tmp_path / "missing.txt")], "cannot read"),
        (["--predictor", str(pred_dir), "--images", str(big)], "use --text"),
        (["--predictor", str(pix_dir), "--text", str(empty)], "use --images"),
        (["--predictor", str(pix_dir), "--images", str(big)], "--max-units"),
        (["--predictor", str(pix_dir), "--images", str(broken)], "cannot read image"),
        (["--predictor", str(pix_dir), "--images", str(tmp_path / "nowhere")], "not a directory"),
        (["--predictor", str(tmp_path), "--text", str(empty)], "glomo export"),
        (["--predictor", str(pred_dir), "--text", str(empty), "--top-k", "0"], "--top-k"),
        (["--predictor", str(pred_dir), "--text", str(empty), "--min-weight", "-1"],
         "--min-weight"),
        (["--predictor", str(pred_dir), "--text", str(empty), "--min-weight", "nan"],
         "--min-weight"),
        (["--predictor", str(pred_dir), "--text", str(empty), "--max-samples", "0"],
         "--max-samples"),
    ]
    for args, message in cases:
        with pytest.raises(SystemExit) as err:
            main(["export", *args, "--output", out])
        assert message in str(err.value), (args, err.value)
    # a feature-reading predictor has no vocabulary for --text
    feature = PretrainedGraphPredictor(GraphPredictor(in_channels=4, hidden_channels=8,
                                                      num_layers=1, heads=1).eval())
    feature.save_pretrained(str(tmp_path / "feat"))
    with pytest.raises(SystemExit, match="reads features"):
        main(["export", "--predictor", str(tmp_path / "feat"), "--text", str(empty), "--output",
              out])


def test_glomo_export_refuses_decompression_bombs_and_huge_lines(tmp_path, monkeypatch):
    import struct
    import zlib

    import glomo_pyg.cli as cli

    pred_dir, pix_dir = tmp_path / "pred", tmp_path / "pix"
    text_predictor().save_pretrained(str(pred_dir))
    pixel_predictor().save_pretrained(str(pix_dir))
    bomb = tmp_path / "bomb"
    bomb.mkdir()

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + \
            struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    # an 80-byte PNG whose header claims 100000 x 100000 pixels
    header = struct.pack(">IIBBBBB", 100000, 100000, 8, 2, 0, 0, 0)
    (bomb / "x.png").write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) +
                                 chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b""))
    for units in ("4096", str(10 ** 12)):
        with pytest.raises(SystemExit, match="x.png: .*pixels"):
            main(["export", "--predictor", str(pix_dir), "--images", str(bomb), "--output",
                  str(tmp_path / "o"), "--max-units", units])
    monkeypatch.setattr(cli, "EXPORT_LINE_BYTES", 64)
    text = tmp_path / "long.txt"
    text.write_text("the cat sat\n" + "word " * 100 + "\n")
    with pytest.raises(SystemExit, match=r"long.txt:2: line longer than 64 bytes"):
        main(["export", "--predictor", str(pred_dir), "--text", str(text), "--output",
              str(tmp_path / "o2")])


def _items(predictor, n):
    sentences = ["the cat sat on the mat .", "the mat", "cat sat", "the cat"]
    return [ExportItem(predictor.encode(sentences[k % 4].split()), f"s{k}",
                       sentences[k % 4].split()) for k in range(n)]


def test_an_export_is_published_as_a_whole(tmp_path, monkeypatch):
    import glomo_pyg.analysis.export_files as export_files

    predictor, out = text_predictor(), tmp_path / "out"
    export_graphs(predictor, _items(predictor, 2), str(out), formats=["json"])
    before = {n: (out / n).read_bytes() for n in os.listdir(out)}
    written = []
    real = export_files._export_sample

    def failing(out_dir, *args):
        if written:
            raise RuntimeError("killed part-way")
        written.append(real(out_dir, *args))
        return written[-1]

    monkeypatch.setattr(export_files, "_export_sample", failing)
    with pytest.raises(RuntimeError, match="part-way"):
        export_graphs(predictor, _items(predictor, 3), str(out), batch_size=1)
    assert {n: (out / n).read_bytes() for n in os.listdir(out)} == before  # the old one
    assert sorted(os.listdir(tmp_path)) == ["out"]  # and nothing staged is left
    with pytest.raises(RuntimeError, match="part-way"):
        export_graphs(predictor, _items(predictor, 3), str(tmp_path / "new"), batch_size=1)
    assert sorted(os.listdir(tmp_path)) == ["out"]  # a new folder: absent
    monkeypatch.setattr(export_files, "_export_sample", real)
    export_graphs(predictor, _items(predictor, 3), str(out), formats=["graphml"])
    assert "sample_00002.graphml" in os.listdir(out)
    assert not [n for n in os.listdir(out) if n.endswith(".json") and n.startswith("sample")]


def test_an_export_never_replaces_a_folder_of_other_files(tmp_path):
    predictor = text_predictor()
    notes = tmp_path / "mine"
    notes.mkdir()
    (notes / "notes.txt").write_text("keep me")
    (notes / "sample_00000.json").write_text("{}")
    with pytest.raises(ValueError, match=r"holds files an export did not write \(notes.txt\)"):
        export_graphs(predictor, _items(predictor, 1), str(notes))
    assert (notes / "notes.txt").read_text() == "keep me"
    assert sorted(os.listdir(tmp_path)) == ["mine"]
    (tmp_path / "file").write_text("x")
    os.symlink(notes, tmp_path / "link")
    for bad in ("file", "link"):
        with pytest.raises(ValueError, match="existing file or link"):
            export_graphs(predictor, _items(predictor, 1), str(tmp_path / bad))
    for bad in ("", "a\0b"):
        with pytest.raises(ValueError, match="non-empty path"):
            export_graphs(predictor, _items(predictor, 1), bad)
    empty = tmp_path / "empty"
    empty.mkdir()
    export_graphs(predictor, _items(predictor, 1), str(empty), formats=["json"])
    assert "index.json" in os.listdir(empty)


@pytest.mark.slow
def test_glomo_export_killed_part_way_leaves_no_partial_folder(tmp_path):
    """SIGTERM (Python's default: no cleanup runs) while samples are being written: the
    output folder is absent; the next export cleans what was staged and completes."""
    import signal
    import subprocess
    import sys
    import time

    pred_dir, text = tmp_path / "pred", tmp_path / "t.txt"
    text_predictor().save_pretrained(str(pred_dir))
    text.write_text("the cat sat\nthe mat .\ncat sat on the mat\n", encoding="utf-8")
    marker = tmp_path / "one-written"
    script = (  # the CLI, its second sample held back until the test has killed it
        "import os, sys, time\n"
        "import glomo_pyg.analysis.export_files as f\n"
        "real = f._export_sample\n"
        "def slow(*a):\n"
        "    r = real(*a)\n"
        f"    open({str(marker)!r}, 'w').close()\n"
        "    time.sleep(120)\n"
        "    return r\n"
        "f._export_sample = slow\n"
        "from glomo_pyg.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n")
    out = tmp_path / "out"
    args = ["export", "--predictor", str(pred_dir), "--text", str(text), "--output", str(out),
            "--threads", "1", "--batch-size", "1"]
    proc = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 120
        while not marker.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert marker.exists(), proc.stderr.read().decode()[-2000:] if proc.stderr else ""
        staged = [n for n in os.listdir(tmp_path) if n.startswith(".out.glomo-new-")]
        assert len(staged) == 1 and "sample_00000.graphml" in os.listdir(tmp_path / staged[0])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not out.exists()  # absent, not a folder of some samples without statistics.md
    assert main(args) == 0
    assert "statistics.md" in os.listdir(out)
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".out.glomo-")]
