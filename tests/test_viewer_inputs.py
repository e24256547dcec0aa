"""The viewer's door (glomo_pyg.analysis.view and `glomo view`): a FIFO given as an input
is refused at once instead of hanging; strings that are not valid text (lone surrogates,
argv bytes that are not UTF-8) are refused naming the argument and UTF-8; images of 16
bits or float are scaled to the page's 8 bits; output paths and input paths with a NUL
are refused, naming the option, before any work."""
import json
import os
import re
import signal

import numpy as np
import pytest
import torch

from glomo_pyg import GraphPredictor, PretrainedGraphPredictor
from glomo_pyg.analysis import GraphView, view
from glomo_pyg.cli import main
from glomo_pyg.data.text import SPECIALS
from glomo_pyg.nn.pixel import PixelGraphPredictor

WORDS = ["the", "cat", "sat", "on", "a", "mat"]
VOCAB = list(SPECIALS) + WORDS
TREEBANK = ("1\tthe\tthe\tDET\t_\t_\t2\tdet\t_\t_\n2\tcat\tcat\tNOUN\t_\t_\t0\troot\t_\t_\n\n")


def text_predictor():
    torch.manual_seed(0)
    return PretrainedGraphPredictor(
        *[GraphPredictor(num_tokens=len(VOCAB), hidden_channels=8, num_layers=1, heads=1,
                         cnn_layers=1, direction=d) for d in ("forward", "backward")],
        VOCAB).eval()


def pixel_predictor(side=4):
    torch.manual_seed(0)
    return PretrainedGraphPredictor(
        *[PixelGraphPredictor(height=side, width=side, hidden_channels=8, num_layers=1,
                              heads=1, cnn_layers=1, direction=d)
          for d in ("forward", "backward")]).eval()


@pytest.fixture
def saved(tmp_path):
    text_predictor().save_pretrained(tmp_path / "text")
    pixel_predictor().save_pretrained(tmp_path / "pixel")
    return tmp_path


def run_view(*args):
    return main(["view", *args])


class Hung(Exception):
    pass


@pytest.fixture
def deadline():
    """A read that blocks (the regression: opening a FIFO waits for a writer) fails the
    test after 10 s instead of hanging the suite: SIGALRM interrupts the open."""
    def hung(signum, frame):
        raise Hung("the read blocked")
    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


# --- FIFOs ---------------------------------------------------------------------------------
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
@pytest.mark.parametrize("option,predictor", [("--image", "pixel"), ("--treebank", "text"),
                                              ("--text-file", "text")])
def test_a_fifo_input_is_refused_at_once(saved, deadline, option, predictor):
    fifo = saved / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(SystemExit, match=f"glomo view: {option} .*fifo is not a regular file"):
        run_view("--predictor", str(saved / predictor), option, str(fifo),
                 "--output", str(saved / "page.html"))
    assert not (saved / "page.html").exists()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_image_is_refused_by_the_api(tmp_path, deadline):
    os.mkfifo(tmp_path / "fifo.png")
    with pytest.raises(ValueError, match="image .*fifo.png is not a regular file"):
        view(pixel_predictor(), image=str(tmp_path / "fifo.png"))


# --- text that is not valid UTF-8 ----------------------------------------------------------
def test_lone_surrogates_are_refused_by_the_api(tmp_path):
    predictor = text_predictor()
    with pytest.raises(ValueError, match=r"^text is not valid UTF-8 \(byte 0xe9 at position "
                                         r"3\)"):
        view(predictor, "caf\udce9 the cat")
    with pytest.raises(ValueError, match=r"^token 1 of text is not valid UTF-8 \(lone "
                                         r"surrogate U\+D800 at position 0\)"):
        view(predictor, ["the", "\ud800", "cat"])
    with pytest.raises(ValueError, match=r"^title is not valid UTF-8"):
        view(predictor, "the cat", title="cat \ud800")
    page = view(predictor, "the cat")
    with pytest.raises(ValueError, match=r"^title is not valid UTF-8"):
        GraphView(page.data, "\ud800").save(tmp_path / "page.html")  # made by hand
    assert not (tmp_path / "page.html").exists()
    # graphs given directly: their tokens pass the same door
    graphs = predictor(predictor.encode(["the", "cat"]), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"^token 0 of text is not valid UTF-8"):
        view(graphs, ["\udce9", "cat"])


def test_a_latin1_byte_in_argv_names_text_and_utf8(tmp_path):
    # Python decodes argv's non-UTF-8 bytes to surrogate escapes: b"caf\xe9" -> "caf\udce9"
    latin1 = os.fsdecode(b"caf\xe9 the cat")
    assert latin1 == "caf\udce9 the cat"
    # refused before the predictor loads (there is none at this path)
    with pytest.raises(SystemExit, match=r"^glomo view: --text is not valid UTF-8 \(byte 0xe9 "
                                         r"at position 3\)$"):
        run_view("--predictor", str(tmp_path / "none"), "--text", latin1,
                 "--output", str(tmp_path / "page.html"))
    assert not (tmp_path / "page.html").exists()


# --- images of more than 8 bits ------------------------------------------------------------
def page_pixels(page, tmp_path):
    """The pixel data embedded in the saved page, read back from its HTML."""
    html = open(page.save(tmp_path / "page.html"), encoding="utf-8").read()
    payload = re.search(r'<script type="application/json" id="glomo-data">(.*?)</script>',
                        html, re.S).group(1)
    return json.loads(payload)["pixels"]


def grey(values):
    return [int(v) for v in np.asarray(values).flatten() for _ in range(3)]


def test_a_16_bit_png_is_scaled_to_8_bits(tmp_path):
    from PIL import Image
    values = np.array([0, 257, 1000, 32768, 65535, 128, 65278, 12850] * 2, np.uint16)
    image = Image.new("I;16", (4, 4))
    image.putdata(values.tolist())
    image.save(tmp_path / "grey16.png")
    with Image.open(tmp_path / "grey16.png") as reread:
        assert reread.mode == "I;16"
        assert np.asarray(reread.convert("RGB")).max() == 255  # Pillow alone: near all white
    want = grey(np.rint(values / 257))
    assert want[:15:3] == [0, 1, 4, 128, 255]
    page = view(pixel_predictor(), image=str(tmp_path / "grey16.png"))
    assert page_pixels(page, tmp_path) == want
    with Image.open(tmp_path / "grey16.png") as img:  # a PIL image given directly
        assert view(pixel_predictor(), image=img).data["pixels"] == want


def test_a_float_tiff_is_scaled_to_8_bits(tmp_path):
    from PIL import Image
    unit = np.linspace(0, 1, 16, dtype=np.float32).reshape(4, 4)
    Image.fromarray(unit, mode="F").save(tmp_path / "unit.tif")
    with Image.open(tmp_path / "unit.tif") as reread:
        assert reread.mode == "F"
        assert np.asarray(reread.convert("RGB")).max() <= 1  # Pillow alone: all black
    page = view(pixel_predictor(), image=str(tmp_path / "unit.tif"))
    assert page_pixels(page, tmp_path) == grey(np.rint(unit.astype(np.float64) * 255))
    # outside [0, 1]: stretched min to max over [0, 255]
    wide = np.arange(16, dtype=np.float32).reshape(4, 4) * 10 - 50
    Image.fromarray(wide, mode="F").save(tmp_path / "wide.tif")
    page = view(pixel_predictor(), image=str(tmp_path / "wide.tif"))
    assert page_pixels(page, tmp_path) == grey(np.rint((wide + 50) / 150 * 255))
    for bad in (np.nan, np.inf):
        wide[1, 2] = bad
        Image.fromarray(wide, mode="F").save(tmp_path / "bad.tif")
        with pytest.raises(ValueError, match="bad.tif holds NaN or infinite pixel values"):
            view(pixel_predictor(), image=str(tmp_path / "bad.tif"))


# --- paths ---------------------------------------------------------------------------------
def test_bad_output_paths_are_refused_before_any_work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "somefile.txt").write_text("x")
    os.mkdir(tmp_path / "folder")
    none = str(tmp_path / "none")  # no predictor here: the output is checked first
    under_file = r"--output somefile.txt/(sub/)?page.html: /.*/somefile.txt is a file, not a " \
                 r"folder$"
    for output, message in [("", "--output is empty"),
                            ("pa\0ge.html", "--output holds a NUL character"),
                            ("somefile.txt/page.html", under_file),
                            ("somefile.txt/sub/page.html", under_file),
                            ("folder", "--output folder is a directory"),
                            ("new/", "--output new/ ends with a separator")]:
        with pytest.raises(SystemExit, match=f"^glomo view: {message}"):
            run_view("--predictor", none, "--text", "the cat", "--output", output)
    assert sorted(os.listdir(tmp_path)) == ["folder", "somefile.txt"]  # no temp file left
    assert os.listdir(tmp_path / "folder") == []
    page = view(text_predictor(), "the cat")
    for output, message in [("", "path is empty"), ("a\0b", "path holds a NUL character"),
                            ("somefile.txt/page.html", "path somefile.txt/page.html: /.*/"
                                                       "somefile.txt is a file, not a folder")]:
        with pytest.raises(ValueError, match=f"^{message}"):
            page.save(output)
    assert sorted(os.listdir(tmp_path)) == ["folder", "somefile.txt"]
    assert page.save("deeper/page.html") == "deeper/page.html"  # missing folders: created


def test_input_paths_with_a_nul_are_refused_naming_the_option(saved):
    output = str(saved / "page.html")
    for option, predictor in [("--image", "pixel"), ("--treebank", "text"),
                              ("--text-file", "text")]:
        with pytest.raises(SystemExit, match=f"^glomo view: {option} holds a NUL character"):
            run_view("--predictor", str(saved / predictor), option, "in\0put", "--output",
                     output)
    with pytest.raises(SystemExit, match="^glomo view: --predictor holds a NUL character"):
        run_view("--predictor", "pre\0dictor", "--text", "the cat", "--output", output)
    with pytest.raises(ValueError, match="^image holds a NUL character"):
        view(pixel_predictor(), image="a\0b.png")
    assert not os.path.exists(output)


def test_an_unexpandable_pretrained_dir_is_a_clean_error(tmp_path, monkeypatch):
    monkeypatch.setenv("GLOMO_PRETRAINED_DIR", "~glomo-no-such-user/x")
    with pytest.raises(SystemExit, match=r"^glomo view: GLOMO_PRETRAINED_DIR="
                                         r"'~glomo-no-such-user/x': its '~' names no home "
                                         r"folder"):
        run_view("--predictor", "no-such-release", "--text", "the cat", "--output",
                 str(tmp_path / "page.html"))


def test_good_inputs_still_make_pages(saved):
    (saved / "gold.conllu").write_text(TREEBANK)
    (saved / "lines.txt").write_text("the mat\ncafé the cat\n")
    from PIL import Image
    Image.new("RGB", (4, 4), (10, 20, 30)).save(saved / "rgb.png")
    output = str(saved / "page.html")
    for args in [("--predictor", str(saved / "text"), "--treebank", str(saved / "gold.conllu")),
                 ("--predictor", str(saved / "text"), "--text-file", str(saved / "lines.txt"),
                  "--line", "2"),
                 ("--predictor", str(saved / "text"), "--text", "café the cat"),
                 ("--predictor", str(saved / "pixel"), "--image", str(saved / "rgb.png"))]:
        assert run_view(*args, "--output", output) == 0
    assert view(pixel_predictor(), image=str(saved / "rgb.png")).data["pixels"][:3] == \
        [10, 20, 30]
