"""Screenshots of the graph viewer for the README, from real pages in headless Chromium.

    python -m benchmarks.viewer_screenshots --treebank DATA/ud-english-ewt/en_ewt-ud-dev.conllu \
        --cifar ~/.cache/glomo-data/cifar-10-batches-py --output docs/figures

Writes ``viewer_text.png`` (the head view of the released ``imdb-text-cpu`` predictor on
an EWT dev sentence, with its gold arcs), ``viewer_matrix.png`` (the matrix view of the
same page) and ``viewer_image.png`` (the image view of ``imagenet32-pixel-cpu`` on a
CIFAR-10 test image), and records what each was made from in ``figures.json``.
Needs Chromium, chromedriver and selenium (``apt-get install chromium chromium-driver``).
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile

from glomo_pyg.atomic_files import atomic_write


def _parse_args(argv) -> argparse.Namespace:
    """The command line: the predictors, the sentence and image shown, the output folder."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text-predictor", default="imdb-text-cpu")
    parser.add_argument("--pixel-predictor", default="imagenet32-pixel-cpu")
    parser.add_argument("--treebank", required=True)
    parser.add_argument("--sentence", type=int, default=12, help="from 1")
    parser.add_argument("--cifar", required=True, help="cifar-10-batches-py")
    parser.add_argument("--image", type=int, default=3, help="index in the test batch")
    parser.add_argument("--output", default="docs/figures")
    return parser.parse_args(argv)


def _pages(args) -> tuple:
    """The treebank sentence, the CIFAR-10 test labels, and the text and image viewer pages."""
    from glomo_pyg import PretrainedGraphPredictor
    from glomo_pyg.analysis import read_treebank, view
    from glomo_pyg.data.images import load_cifar10

    tree = read_treebank(args.treebank, max_sentences=args.sentence)[args.sentence - 1]
    text = PretrainedGraphPredictor.from_pretrained(args.text_predictor)
    words = [w.lower() for w in tree.words]
    text_page = view(text, words, gold=tree)
    images, labels = load_cifar10(args.cifar, "test")
    pixel_page = view(PretrainedGraphPredictor.from_pretrained(args.pixel_predictor),
                      image=images[args.image])
    return tree, labels, text_page, pixel_page


def _chrome():
    """A headless Chromium driven by chromedriver."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1000,880",
                "--hide-scrollbars"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)


def _screenshots(text_page, pixel_page, output: str) -> dict:
    """Screenshot the head and matrix views of the text page and the image page; the paths."""
    from selenium.webdriver.common.by import By

    driver = _chrome()
    written = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            driver.get("file://" + text_page.save(os.path.join(tmp, "text.html")))
            shot = os.path.join(output, "viewer_text.png")
            driver.save_screenshot(shot)
            written["viewer_text"] = shot
            driver.find_element(By.CSS_SELECTOR, 'button.tab[data-view="matrix"]').click()
            shot = os.path.join(output, "viewer_matrix.png")
            driver.save_screenshot(shot)
            written["viewer_matrix"] = shot
            driver.get("file://" + pixel_page.save(os.path.join(tmp, "image.html")))
            shot = os.path.join(output, "viewer_image.png")
            driver.save_screenshot(shot)
            written["viewer_image"] = shot
    finally:
        driver.quit()
    return written


def _record(args, written: dict, tree, labels) -> None:
    """Record in ``figures.json`` what each screenshot was made from (other entries kept)."""
    record = os.path.join(args.output, "figures.json")
    kept = json.load(open(record)) if os.path.exists(record) else {}
    for name, path in written.items():
        kept[name] = dict(predictor=args.pixel_predictor if name == "viewer_image"
                          else args.text_predictor, files=[path],
                          **(dict(image=args.image, label=int(labels[args.image]))
                             if name == "viewer_image" else
                             dict(treebank=os.path.basename(args.treebank),
                                  sentence=args.sentence, words=" ".join(tree.words))))
    with atomic_write(record) as fh:
        json.dump(kept, fh, indent=1)


def main(argv=None) -> None:
    args = _parse_args(argv)
    import selenium.webdriver  # noqa: F401  (selenium is needed: checked before the pages)

    tree, labels, text_page, pixel_page = _pages(args)
    written = _screenshots(text_page, pixel_page, args.output)
    _record(args, written, tree, labels)
    for name, path in written.items():
        print(name, "->", path)


if __name__ == "__main__":
    main()
