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


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text-predictor", default="imdb-text-cpu")
    parser.add_argument("--pixel-predictor", default="imagenet32-pixel-cpu")
    parser.add_argument("--treebank", required=True)
    parser.add_argument("--sentence", type=int, default=12, help="from 1")
    parser.add_argument("--cifar", required=True, help="cifar-10-batches-py")
    parser.add_argument("--image", type=int, default=3, help="index in the test batch")
    parser.add_argument("--output", default="docs/figures")
    args = parser.parse_args(argv)

    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

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
    options = Options()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1000,880",
                "--hide-scrollbars"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    written = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            driver.get("file://" + text_page.save(os.path.join(tmp, "text.html")))
            shot = os.path.join(args.output, "viewer_text.png")
            driver.save_screenshot(shot)
            written["viewer_text"] = shot
            driver.find_element(By.CSS_SELECTOR, 'button.tab[data-view="matrix"]').click()
            shot = os.path.join(args.output, "viewer_matrix.png")
            driver.save_screenshot(shot)
            written["viewer_matrix"] = shot
            driver.get("file://" + pixel_page.save(os.path.join(tmp, "image.html")))
            shot = os.path.join(args.output, "viewer_image.png")
            driver.save_screenshot(shot)
            written["viewer_image"] = shot
    finally:
        driver.quit()
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
    for name, path in written.items():
        print(name, "->", path)


if __name__ == "__main__":
    main()
