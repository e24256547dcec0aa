"""The graph viewer (glomo_pyg.analysis.view): the page's data equal the graphs (edges,
weights, heads, layers, chained products) with the threshold and top-k applied exactly;
the page is self-contained HTML5 of bounded size; bad input is named; and in a real
headless Chromium the page shows what the tensors say."""
import json
import os
import re
import shutil

import numpy as np
import pytest
import torch

from glomo_pyg import GraphPredictor, PretrainedGraphPredictor
from glomo_pyg.analysis import GraphView, view, view_data
from glomo_pyg.analysis.treebank import GoldTree
from glomo_pyg.cli import main
from glomo_pyg.data.text import SPECIALS
from glomo_pyg.nn.pixel import PixelGraphPredictor
from glomo_pyg.pixels import image_units

WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "slept"]
VOCAB = list(SPECIALS) + WORDS


def text_predictor(layers=2, heads=2):
    torch.manual_seed(0)
    parts = [GraphPredictor(num_tokens=len(VOCAB), hidden_channels=8, num_layers=layers,
                            heads=heads, cnn_layers=1, direction=d)
             for d in ("forward", "backward")]
    return PretrainedGraphPredictor(*parts, VOCAB).eval()


def pixel_predictor(side=4, layers=2, heads=2):
    torch.manual_seed(0)
    parts = [PixelGraphPredictor(height=side, width=side, hidden_channels=8, num_layers=layers,
                                 heads=heads, cnn_layers=1, direction=d)
             for d in ("forward", "backward")]
    return PretrainedGraphPredictor(*parts).eval()


def expected_lists(edges, n, head, min_weight, top_k):
    """The page's per-target lists, written from the edge list itself."""
    (src, tgt), w, h = edges
    per_target = {j: [] for j in range(n)}
    for i, j, weight, hh in zip(src.tolist(), tgt.tolist(), w.tolist(), h.tolist()):
        if hh == head and weight >= min_weight and weight > 0:
            per_target[j].append((i, weight))
    out = []
    for j in range(n):
        kept = sorted(per_target[j], key=lambda e: (-e[1], e[0]))
        out.append(kept[:top_k] if top_k is not None else kept)
    return out


def page_lists(graph):
    return [list(zip(graph["src"][a:b], graph["w"][a:b]))
            for a, b in zip(graph["ptr"][:-1], graph["ptr"][1:])]


def assert_same_lists(got, want):
    assert [[i for i, _ in t] for t in got] == [[i for i, _ in t] for t in want]
    for g, w in zip(got, want):
        for (_, a), (_, b) in zip(g, w):
            assert abs(a - b) <= 1e-5


@pytest.mark.parametrize("min_weight,top_k", [(0.0, None), (0.05, None), (0.01, 2), (0.2, 1)])
def test_text_data_equal_the_graphs_with_threshold_and_top_k(min_weight, top_k):
    predictor = text_predictor()
    tokens = WORDS[:6]
    data = view_data(predictor, tokens, min_weight=min_weight, top_k=top_k)
    graphs = predictor(predictor.encode(tokens), torch.zeros(6, dtype=torch.long))
    assert data["kind"] == "text" and data["tokens"] == tokens
    for d in ("forward", "backward"):
        g = getattr(graphs, d)
        info = data["directions"][d]
        assert (info["layers"], info["heads"]) == (2, 2)
        for l in range(2):
            for h in range(2):
                assert_same_lists(page_lists(info["graphs"][l][h]),
                                  expected_lists(g.layer(l), 6, h, min_weight, top_k))
        # chained products G^1 G^2, from the dense graphs
        dense = g.to_dense()[:, 0].detach().double()
        for h in range(2):
            product = dense[0, h] @ dense[1, h]
            rows = []
            for j in range(6):
                col = [(i, float(product[i, j])) for i in range(6)
                       if float(product[i, j]) >= min_weight and float(product[i, j]) > 0]
                col.sort(key=lambda e: (-e[1], e[0]))
                rows.append(col[:top_k] if top_k is not None else col)
            assert_same_lists(page_lists(info["products"][1][h]), rows)


def test_image_data_equal_the_graphs_and_the_pixels(tmp_path):
    predictor = pixel_predictor()
    image = torch.randint(0, 256, (3, 4, 4), dtype=torch.uint8,
                          generator=torch.Generator().manual_seed(1))
    data = view_data(predictor, image=image, top_k=3)
    assert data["kind"] == "image" and (data["height"], data["width"]) == (4, 4)
    assert data["pixels"] == image.permute(1, 2, 0).flatten().tolist()
    from glomo_pyg.pixels import image_units

    graphs = predictor(*image_units(image[None]))
    for d in ("forward", "backward"):
        for l in range(2):
            for h in range(2):
                assert_same_lists(page_lists(data["directions"][d]["graphs"][l][h]),
                                  expected_lists(getattr(graphs, d).layer(l), 16, h, 0.01, 3))
    assert "products" not in data["directions"]["forward"]
    # the same image as [H, W, 3] numpy, and from a file
    assert view_data(predictor, image=image.permute(1, 2, 0).numpy(), top_k=3) == data
    from PIL import Image
    path = tmp_path / "image.png"
    Image.fromarray(image.permute(1, 2, 0).numpy()).save(path)
    assert view_data(predictor, image=str(path), top_k=3) == data


def test_the_page_is_self_contained_html5_with_its_data(tmp_path):
    html5lib = pytest.importorskip("html5lib")
    page = view(text_predictor(), " ".join(WORDS))
    assert isinstance(page, GraphView) and page.title.startswith("GLoMo graphs: the cat")
    text = page.html
    parser = html5lib.HTMLParser(strict=True)
    parser.parse(text)  # raises on any HTML5 parse error
    assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", text)  # no network
    embedded = re.search(r'<script type="application/json" id="glomo-data">(.*?)</script>',
                         text, re.S).group(1)
    assert "<" not in embedded
    assert json.loads(embedded) == json.loads(json.dumps(page.data))
    assert page.save(tmp_path / "p.html") == str(tmp_path / "p.html")
    assert (tmp_path / "p.html").read_text() == text
    assert "<iframe" in page._repr_html_() and "sandbox" in page._repr_html_()


def test_a_hostile_token_cannot_end_the_script():
    tokens = ["the", "</script><script>alert(1)</script>", "<!--<script>", "cat"]
    page = view(text_predictor(), tokens)
    assert page.html.count("</script>") == 2  # the data block's and the viewer's
    embedded = re.search(r'id="glomo-data">(.*?)</script>', page.html, re.S).group(1)
    assert json.loads(embedded)["tokens"] == tokens


@pytest.mark.slow
def test_a_32x32_page_with_24_graphs_stays_under_3_mb():
    predictor = pixel_predictor(side=32, layers=3, heads=4)  # 2 x 3 x 4 = 24 graphs
    image = torch.randint(0, 256, (3, 32, 32), dtype=torch.uint8)
    size = len(view(predictor, image=image).html.encode())
    assert size < 3 << 20, size


def test_bad_input_is_named(tmp_path):
    text, pixels = text_predictor(), pixel_predictor()
    with pytest.raises(ValueError, match="exactly one of text"):
        view(text)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        view(text, "cat")
    with pytest.raises(ValueError, match="pixel predictor: give image="):
        view(pixels, "the cat")
    with pytest.raises(ValueError, match="reads text: give text="):
        view(text, image=torch.zeros(3, 4, 4, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"the image is 65x65 pixels \(4225\); the viewer "
                                         "shows images of at most 4096 pixels"):
        view(pixels, image=torch.zeros(3, 65, 65, dtype=torch.uint8))
    with pytest.raises(ValueError, match="uint8 with 3 colour planes"):
        view(pixels, image=torch.zeros(3, 4, 4))
    (tmp_path / "bad.png").write_bytes(b"not an image")
    with pytest.raises(ValueError, match="cannot read image .*bad.png"):
        view(pixels, image=str(tmp_path / "bad.png"))
    from PIL import Image
    Image.new("RGB", (100, 100)).save(tmp_path / "big.png")
    with pytest.raises(ValueError, match="big.png is 100x100 pixels; the viewer shows images "
                                         "of at most 4096"):
        view(pixels, image=str(tmp_path / "big.png"))
    with pytest.raises(ValueError, match="min_weight must be a non-negative number"):
        view(text, "the cat", min_weight=-0.5)
    with pytest.raises(ValueError, match="top_k must be a positive integer"):
        view(text, "the cat", top_k=0)
    with pytest.raises(ValueError, match="has 2 words, the sentence 3 tokens"):
        view(text, "the cat sat", gold=GoldTree(["the", "cat"], [2, 0], ["DET", "NOUN"]))
    with pytest.raises(ValueError, match="is a directory"):
        view(text, "the cat").save(tmp_path)
    with pytest.raises(TypeError, match="must be a PretrainedGraphPredictor"):
        view(text.predictor("forward"), "the cat")


def write_treebank(path):
    path.write_text("1\tthe\tthe\tDET\t_\t_\t2\tdet\t_\t_\n2\tcat\tcat\tNOUN\t_\t_\t3\tnsubj\t_\t_\n"
                    "3\tsat\tsit\tVERB\t_\t_\t0\troot\t_\t_\n\n")
    return str(path)


def test_the_command_line(tmp_path, capsys):
    text_predictor().save_pretrained(tmp_path / "text")
    out = tmp_path / "page.html"
    assert main(["view", "--predictor", str(tmp_path / "text"), "--text", "the cat sat",
                 "--output", str(out)]) == 0
    assert out.is_file() and "glomo view:" in capsys.readouterr().out
    lines = tmp_path / "lines.txt"
    lines.write_text("the cat\nthe mat and the cat\n")
    assert main(["view", "--predictor", str(tmp_path / "text"), "--text-file", str(lines),
                 "--line", "2", "--output", str(out)]) == 0
    treebank = write_treebank(tmp_path / "gold.conllu")
    assert main(["view", "--predictor", str(tmp_path / "text"), "--treebank", treebank,
                 "--output", str(out)]) == 0
    assert '"gold":[1,2,-1]' in out.read_text()
    for args, message in [
            # (argparse's mutually exclusive group: its usage error, exit status 2)
            (["--text", "a b", "--image", "x.png"], r"exactly one of|^2$"),
            (["--treebank", treebank, "--sentence", "5"], "--sentence 5 is out of range: "
                                                          r".*holds 1 sentence"),
            (["--text-file", str(lines), "--line", "9"], "fewer than 9 lines"),
            (["--text", "the cat", "--output", str(tmp_path)], "is a directory")]:
        argv = ["view", "--predictor", str(tmp_path / "text"), *args]
        if "--output" not in args:
            argv += ["--output", str(out)]
        with pytest.raises(SystemExit, match=message):
            main(argv)


@pytest.mark.parametrize("side", [28, pytest.param(32, marks=pytest.mark.slow),
                                  pytest.param(64, marks=pytest.mark.slow)])
def test_images_of_other_sizes_are_read_as_glomo_export_reads_them(tmp_path, side):
    """One rule for the viewer and the export (analysis.export.image_predictor): an image
    of at most 4096 pixels (28x28, 32x32 and exactly 64x64) is read at its own size by the
    predictor's weights at that size, never resampled; both show the same graphs."""
    from PIL import Image

    pixels = pixel_predictor(side=4, layers=1, heads=1)
    pixels.save_pretrained(tmp_path / "pix")
    image = np.random.default_rng(side).integers(0, 256, (side, side, 3), dtype=np.uint8)
    folder = tmp_path / "in"
    folder.mkdir()
    Image.fromarray(image).save(folder / "a.png")
    out = tmp_path / "page.html"
    assert main(["view", "--predictor", str(tmp_path / "pix"), "--image",
                 str(folder / "a.png"), "--output", str(out), "--min-weight", "0"]) == 0
    data = json.loads(re.search(r'id="glomo-data">(.*?)</script>', out.read_text(),
                                re.S).group(1))  # each target's 8 heaviest sources
    assert (data["height"], data["width"]) == (side, side)
    with torch.no_grad():
        dense = pixels.resized(side, side)(*image_units(
            torch.from_numpy(image).permute(2, 0, 1)[None])).forward.to_dense()[0, 0, 0]
    page = data["directions"]["forward"]["graphs"][0][0]  # layer 0, head 0, CSR by target
    assert len(page["ptr"]) == side * side + 1
    last = side * side - 1
    sources = page["src"][page["ptr"][last]:page["ptr"][last + 1]]
    weights = page["w"][page["ptr"][last]:page["ptr"][last + 1]]
    assert len(sources) == 8
    assert weights == pytest.approx(dense[sources, last].tolist(), abs=1e-5)
    assert main(["export", "--predictor", str(tmp_path / "pix"), "--images", str(folder),
                 "--output", str(tmp_path / "out"), "--formats", "json", "--top-k", "8"]) == 0
    exported = json.loads((tmp_path / "out" / "sample_00000.json").read_text())
    assert len(exported["units"]) == side * side
    forward = exported["graphs"][0]
    into_last = {i: w for i, j, w in zip(forward["source"], forward["target"],
                                         forward["weight"]) if j == last}
    assert into_last == pytest.approx({i: float(dense[i, last]) for i in into_last})
    assert set(sources) == set(into_last)  # the same 8 heaviest sources


def test_images_over_4096_pixels_are_refused_alike_with_their_size(tmp_path):
    from PIL import Image

    pixels = pixel_predictor(side=4, layers=1, heads=1)
    pixels.save_pretrained(tmp_path / "pix")
    Image.new("RGB", (65, 65)).save(tmp_path / "b.png")
    with pytest.raises(SystemExit, match="b.png is 65x65 pixels; the viewer shows images of "
                                         r"at most 4096 pixels \(e.g. 64x64\)"):
        main(["view", "--predictor", str(tmp_path / "pix"), "--image", str(tmp_path / "b.png"),
              "--output", str(tmp_path / "b.html")])
    with pytest.raises(SystemExit, match="b.png is 65x65 pixels; more than --max-units 4096"):
        main(["export", "--predictor", str(tmp_path / "pix"), "--images", str(tmp_path),
              "--output", str(tmp_path / "out")])
    with pytest.raises(ValueError, match="the image is 1x1 pixels: a graph needs at least 2"):
        view(pixels, image=torch.zeros(3, 1, 1, dtype=torch.uint8))


def test_the_command_line_names_its_flags(tmp_path):
    text_predictor().save_pretrained(tmp_path / "text")
    pixel_predictor().save_pretrained(tmp_path / "pix")
    from PIL import Image

    Image.new("RGB", (4, 4)).save(tmp_path / "a.png")
    with pytest.raises(SystemExit, match="is a pixel predictor: give --image FILE"):
        main(["view", "--predictor", str(tmp_path / "pix"), "--text", "the cat",
              "--output", str(tmp_path / "p.html")])
    with pytest.raises(SystemExit, match="reads text: give --text, --text-file or --treebank, "
                                         "not --image"):
        main(["view", "--predictor", str(tmp_path / "text"), "--image",
              str(tmp_path / "a.png"), "--output", str(tmp_path / "p.html")])
    for flag, value, message in (("--top-k", "0", "--top-k must be a positive integer, got 0"),
                                 ("--min-weight", "-1",
                                  "--min-weight must be a non-negative number, got -1.0")):
        with pytest.raises(SystemExit, match=message):  # (view() says top_k=, min_weight=)
            main(["view", "--predictor", str(tmp_path / "text"), "--text", "the cat", flag,
                  value, "--output", str(tmp_path / "p.html")])


# --- in a real browser -----------------------------------------------------------------------
def browser():
    """Headless Chromium through Selenium and Debian's chromedriver; skipped where there is
    none, unless GLOMO_REQUIRE_BROWSER=1 (CI) makes its absence a failure."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    try:
        from selenium import webdriver
    except ImportError:
        webdriver = None
    if not (binary and driver and webdriver):
        if os.environ.get("GLOMO_REQUIRE_BROWSER") == "1":
            pytest.fail("GLOMO_REQUIRE_BROWSER=1 but no chromium, chromedriver or selenium")
        pytest.skip("no headless Chromium here (apt-get install chromium chromium-driver)")
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    options = Options()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1100,900",
                "--disable-dev-shm-usage"):
        options.add_argument(arg)
    options.binary_location = binary
    return webdriver.Chrome(service=Service(driver), options=options)


def count_edges(data, direction, layer, heads, product=False, target=None, source=None):
    info = data["directions"][direction]
    n = 0
    for h in heads:
        g = (info["products"] if product else info["graphs"])[layer][h]
        for j, (a, b) in enumerate(zip(g["ptr"][:-1], g["ptr"][1:])):
            for i in g["src"][a:b]:
                if (target is None or j == target) and (source is None or i == source):
                    n += 1
    return n


@pytest.fixture(scope="module")
def chrome():
    driver = browser()
    yield driver
    driver.quit()


@pytest.mark.slow
def test_the_text_page_in_a_browser(chrome, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    tokens = ["the", "cat", "sat", "on", "the", "mat"]
    gold = GoldTree(tokens, [2, 3, 0, 6, 6, 3], ["DET", "NOUN", "VERB", "ADP", "DET", "NOUN"])
    page = view(text_predictor(), tokens, gold=gold, min_weight=0.0)
    path = page.save(tmp_path / "text.html")
    chrome.get("file://" + path)
    data = page.data
    svg = chrome.find_element(By.ID, "head-view")
    drawn = lambda: int(chrome.find_element(By.ID, "head-view").get_attribute("data-edges"))  # noqa: E731
    assert drawn() == count_edges(data, "forward", 0, [0, 1])
    assert len(chrome.find_elements(By.CSS_SELECTOR, "line.edge")) == drawn()
    assert int(svg.get_attribute("data-gold")) == 5  # the root has no arc
    chrome.save_screenshot(str(tmp_path / "text-head-view.png"))
    # one head, then layer 2, then the chained product, then the backward graphs
    chrome.find_element(By.CSS_SELECTOR, 'input.head[data-head="1"]').click()
    assert drawn() == count_edges(data, "forward", 0, [0])
    Select(chrome.find_element(By.ID, "layer")).select_by_value("g1")
    assert drawn() == count_edges(data, "forward", 1, [0])
    Select(chrome.find_element(By.ID, "layer")).select_by_value("p1")
    assert drawn() == count_edges(data, "forward", 1, [0], product=True)
    Select(chrome.find_element(By.ID, "direction")).select_by_value("backward")
    assert drawn() == count_edges(data, "backward", 0, [0, 1])  # heads reset, layer kept
    Select(chrome.find_element(By.ID, "layer")).select_by_value("g0")
    # hover a target: only its incoming edges stay
    target = chrome.find_element(By.CSS_SELECTOR, 'text.tgt-token[data-index="2"]')
    ActionChains(chrome).move_to_element(target).perform()
    assert drawn() == count_edges(data, "backward", 0, [0, 1], target=2)
    source = chrome.find_element(By.CSS_SELECTOR, 'text.src-token[data-index="4"]')
    ActionChains(chrome).move_to_element(source).perform()
    assert drawn() == count_edges(data, "backward", 0, [0, 1], source=4)
    # the matrix view: layers x heads; a click opens one graph in the head view
    chrome.find_element(By.CSS_SELECTOR, 'button.tab[data-view="matrix"]').click()
    cells = chrome.find_elements(By.CSS_SELECTOR, "canvas.cell")
    assert len(cells) == 2 * 2
    chrome.save_screenshot(str(tmp_path / "text-matrix-view.png"))
    chrome.find_element(By.CSS_SELECTOR, 'canvas.cell[data-layer="1"][data-head="0"]').click()
    assert drawn() == count_edges(data, "backward", 1, [0])
    assert not chrome.get_log("browser") if hasattr(chrome, "get_log") else True


@pytest.mark.slow
def test_the_image_page_in_a_browser(chrome, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    predictor = pixel_predictor(side=8)
    image = torch.randint(0, 256, (3, 8, 8), dtype=torch.uint8,
                          generator=torch.Generator().manual_seed(2))
    page = view(predictor, image=image, top_k=4)
    path = page.save(tmp_path / "image.html")
    chrome.get("file://" + path)
    data = page.data
    main_canvas = chrome.find_element(By.ID, "image")
    root = chrome.find_element(By.ID, "glomo-viewer")
    assert int(root.get_attribute("data-pixel")) == 4 * 8 + 4  # the centre first

    def lit(layer, head):
        return int(chrome.find_element(
            By.CSS_SELECTOR, f'canvas.overlay[data-layer="{layer}"][data-head="{head}"]'
        ).get_attribute("data-highlighted"))

    def expected(direction, layer, head, pixel):
        g = data["directions"][direction]["graphs"][layer][head]
        return sum(w > 0 for w in g["w"][g["ptr"][pixel]:g["ptr"][pixel + 1]])

    # point at row 5, column 6 of the 8x8 image (the canvas is drawn 320 px wide)
    size = main_canvas.size
    ActionChains(chrome).move_to_element_with_offset(
        main_canvas, int((6.5 / 8 - 0.5) * size["width"]),
        int((5.5 / 8 - 0.5) * size["height"])).perform()
    pixel = int(root.get_attribute("data-pixel"))
    assert pixel == 5 * 8 + 6
    for l in range(2):
        for h in range(2):
            assert lit(l, h) == expected("forward", l, h, pixel)
    chrome.save_screenshot(str(tmp_path / "image-view.png"))
    # the keyboard moves the pixel (each render draws a new canvas: found again)
    chrome.find_element(By.ID, "image").send_keys(Keys.ARROW_LEFT)
    assert int(root.get_attribute("data-pixel")) == pixel - 1
    chrome.find_element(By.ID, "image").send_keys(Keys.ARROW_UP)
    assert int(root.get_attribute("data-pixel")) == pixel - 1 - 8
    from selenium.webdriver.support.ui import Select
    Select(chrome.find_element(By.ID, "direction")).select_by_value("backward")
    pixel = int(root.get_attribute("data-pixel"))
    assert lit(1, 0) == expected("backward", 1, 0, pixel)


def test_graphs_given_directly_are_checked_against_their_tokens():
    predictor = text_predictor()
    x = predictor.encode(WORDS[:5] + WORDS[:3])
    batch = torch.tensor([0] * 5 + [1] * 3)
    graphs = predictor(x, batch)
    from_graphs = view_data(graphs, WORDS[:3], sample=1)
    direct = view_data(predictor, WORDS[:3])
    assert from_graphs["directions"] == direct["directions"]  # the same sentence's graphs
    only_forward = view_data(graphs.forward, WORDS[:5])
    assert list(only_forward["directions"]) == ["forward"]
    with pytest.raises(ValueError, match="4 tokens given, but sequence 0 of the graphs has 5"):
        view(graphs, WORDS[:4])
    with pytest.raises(ValueError, match=r"sample must be an integer in \[0, 2\)"):
        view(graphs, WORDS[:3], sample=2)
    with pytest.raises(ValueError, match="the image has 9 pixels, but sequence 0"):
        view(graphs, image=torch.zeros(3, 3, 3, dtype=torch.uint8))
