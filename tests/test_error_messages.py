"""The last unhelpful messages (issue: reliability): each says which setting or input is
wrong, in the library's words."""
import pickle

import numpy as np
import pytest
import torch

from glomo_pyg import GraphPredictor, PretrainedGraphPredictor, save_pretrained
from glomo_pyg.cli import main
from glomo_pyg.data.images import ImageDataError, UnsafePickleError, read_image_batch
from glomo_pyg.data.text import SPECIALS


def test_batch_norm_on_a_one_unit_batch_names_the_setting():
    model = GraphPredictor(num_tokens=50, hidden_channels=16, num_layers=2, heads=2,
                           cnn_layers=1, norm="batch").train()
    with pytest.raises(ValueError, match=r"norm='batch' needs at least 2 units in a batch while "
                                         r"training .*got 1.*norm='layer'.*eval\(\)"):
        model(torch.tensor([3]))
    model(torch.tensor([3, 4]))  # two units: batch statistics exist
    model.eval()(torch.tensor([3]))  # running statistics: any batch


def write_pickle(path, obj):
    with open(path, "wb") as fh:
        pickle.dump(obj, fh)
    return str(path)


def test_an_image_batch_without_images_says_so(tmp_path):
    path = write_pickle(tmp_path / "data_batch_1",
                        {"data": np.zeros((0, 3 * 32 * 32), np.uint8), "labels": []})
    with pytest.raises(ImageDataError, match=r"data_batch_1: 'data' .*(no images|\(0, 3072\))"):
        read_image_batch(path)
    path = write_pickle(tmp_path / "odd", {"data": np.zeros((2, 100), np.uint8), "labels": [0, 1]})
    with pytest.raises(ImageDataError, match=r"odd: .*(100|colour planes)"):
        read_image_batch(path)


def test_a_pickle_nested_too_deeply_is_refused_naming_the_file(tmp_path):
    deep = [1]
    for _ in range(20):
        deep = [deep]
    path = write_pickle(tmp_path / "deep_batch", {"data": deep})
    with pytest.raises(UnsafePickleError, match=r"deep_batch: .*nesting"):
        read_image_batch(path)


def test_export_names_max_tokens_when_it_would_leave_nothing(tmp_path):
    vocabulary = list(SPECIALS) + ["a", "b", "c"]
    torch.manual_seed(0)
    save_pretrained(PretrainedGraphPredictor(GraphPredictor(
        num_tokens=len(vocabulary), hidden_channels=8, num_layers=1, heads=2, cnn_layers=1),
        vocabulary=vocabulary), tmp_path / "p")
    text = tmp_path / "t.txt"
    text.write_text("a b c\nb c a\n")
    with pytest.raises(SystemExit, match=r"^glomo export: --max-tokens must be an integer "
                                         r">= 2 \(a graph over one token has no edges\), "
                                         r"got 1"):
        main(["export", "--predictor", str(tmp_path / "p"), "--text", str(text),
              "--max-tokens", "1", "--output", str(tmp_path / "out")])
