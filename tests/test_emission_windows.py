"""Every path that emits graphs from a released predictor follows one distance rule
(``PretrainedGraphPredictor.extrapolation_warning``): ``export_graphs`` / ``glomo export``
and ``view`` / ``glomo view`` warn, once, on inputs longer (or images larger) than the
predictor's learned distance term saw, say which window to pass (as the command's flag on
the command line), and cut every graph to ``max_distance`` when given."""
import json
import warnings

import pytest
import torch

from glomo_pyg import PretrainedGraphPredictor
from glomo_pyg.analysis import view_data
from glomo_pyg.analysis.export_files import ExportItem, export_graphs
from glomo_pyg.cli import main

WORDS = "the film was good and the story was not bad but the actor".split()


def text_release():
    return PretrainedGraphPredictor.from_pretrained("imdb-text-cpu")


def words(count):
    return [WORDS[k % len(WORDS)] for k in range(count)]


def distance_warnings(call):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = call()
    return result, [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


def longest_edge(graph_json):
    """The largest |source - target| of an exported edge list's graphs (text: positions)."""
    return max(abs(s - t) for g in graph_json["graphs"] for s, t in zip(g["source"], g["target"]))


def page_edges(data):
    """``(source, target)`` of every edge of a viewer page's graphs (not their products)."""
    for direction in data["directions"].values():
        for layer in direction["graphs"]:
            for graph in layer:
                for j, (a, b) in enumerate(zip(graph["ptr"][:-1], graph["ptr"][1:])):
                    yield from ((i, j) for i in graph["src"][a:b])


def test_export_warns_once_and_cuts_to_max_distance(tmp_path):
    p = text_release()
    window = p.trained_length - 1
    items = [ExportItem(p.encode(words(n)), f"s{n}", words(n)) for n in (90, 12, 80)]
    index, shown = distance_warnings(lambda: export_graphs(p, items, str(tmp_path / "all"),
                                                           formats=["json"], batch_size=1))
    assert len(shown) == 1 and shown[0].startswith("export_graphs: sequences of up to 90 units")
    assert f"max_distance={window}" in shown[0]
    assert longest_edge(json.loads((tmp_path / "all" / "sample_00000.json").read_text())) == 89
    cut, shown = distance_warnings(lambda: export_graphs(
        p, items, str(tmp_path / "cut"), formats=["json"], max_distance=window))
    assert shown == [] and cut["max_distance"] == window
    for k, (whole, part) in enumerate(zip(index["samples"], cut["samples"])):
        data = json.loads((tmp_path / "cut" / f"sample_0000{k}.json").read_text())
        assert longest_edge(data) <= window
        assert (part["num_edges"] < whole["num_edges"]) == (whole["num_units"] > window + 1)
    with torch.no_grad():  # the cut graphs are the predictor's graphs within the window
        ref = p(items[0].x, torch.zeros(90, dtype=torch.long)).forward.within(window)
    dense = ref.to_dense(layer=1)[0, 2].double()  # [T, T] of layer 1, head 2
    first = json.loads((tmp_path / "cut" / "sample_00000.json").read_text())
    graph = next(g for g in first["graphs"] if (g["direction"], g["layer"], g["head"]) ==
                 ("forward", 1, 2))
    got = torch.zeros_like(dense)
    got[graph["source"], graph["target"]] = torch.tensor(graph["weight"], dtype=torch.double)
    assert torch.allclose(got, dense, atol=1e-6) and int(dense.count_nonzero()) > 0
    with pytest.raises(ValueError, match="max_distance"):
        export_graphs(p, items, str(tmp_path / "bad"), max_distance=0)


def test_export_of_images_larger_than_the_trained_crops_warns():
    p = PretrainedGraphPredictor.from_pretrained("imagenet32-pixel-cpu")
    (h, w) = p.trained_size
    image = torch.randint(0, 256, (3, 2 * h, 2 * w), dtype=torch.uint8, generator=
                          torch.Generator().manual_seed(0))
    _, shown = distance_warnings(lambda: view_data(p, image=image, top_k=2))
    assert len(shown) == 1 and shown[0].startswith(f"view: {2 * h}x{2 * w} images")
    assert f"max_distance={min(h, w) - 1}" in shown[0]
    data, shown = distance_warnings(lambda: view_data(p, image=image, top_k=2,
                                                      max_distance=min(h, w) - 1))
    assert shown == []
    width, edges = data["width"], list(page_edges(data))
    assert edges
    assert max(max(abs(i // width - j // width), abs(i % width - j % width))
               for i, j in edges) == min(h, w) - 1


def test_view_warns_on_long_sentences_and_cuts_given_graphs():
    p = text_release()
    window = p.trained_length - 1
    _, shown = distance_warnings(lambda: view_data(p, words(100)))
    assert len(shown) == 1 and shown[0].startswith("view: sequences of up to 100 units")
    data, shown = distance_warnings(lambda: view_data(p, words(100), max_distance=5))
    assert shown == []
    assert max(abs(i - j) for i, j in page_edges(data)) == 5
    _, shown = distance_warnings(lambda: view_data(p, words(window + 1)))
    assert shown == []  # (as long as the pretraining's sequences: nothing extrapolated)
    with torch.no_grad():
        given = p(p.encode(words(30)), torch.zeros(30, dtype=torch.long))
    cut = view_data(given, words(30), max_distance=3, min_weight=0.0)
    same = view_data(given.within(3), words(30), min_weight=0.0)
    assert cut["directions"] == same["directions"]
    with pytest.raises(ValueError, match="max_distance"):
        view_data(p, words(5), max_distance=-1)


def test_the_commands_advise_their_own_flag(tmp_path, capsys):
    text = tmp_path / "long.txt"
    text.write_text(" ".join(words(100)) + "\n", encoding="utf-8")
    for command in (["export", "--text", str(text), "--output", str(tmp_path / "out")],
                    ["view", "--text-file", str(text), "--output", str(tmp_path / "p.html")]):
        assert main([command[0], "--predictor", "imdb-text-cpu", *command[1:]]) == 0
        err = capsys.readouterr().err
        assert err.count("warning:") == 1 and "Pass --max-distance 63 " in err, err
        assert "max_distance=" not in err
        assert main([command[0], "--predictor", "imdb-text-cpu", *command[1:],
                     "--max-distance", "63"]) == 0
        assert "warning" not in capsys.readouterr().err
        with pytest.raises(SystemExit, match="--max-distance must be a positive integer"):
            main([command[0], "--predictor", "imdb-text-cpu", *command[1:],
                  "--max-distance", "0"])
