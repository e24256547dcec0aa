"""PretrainedGraphPredictor.encode: strings refused or split explicitly, tokens lower-cased
as the vocabulary was built, a fix named for unknown tokens, a warning when most are."""
import json
import warnings

import pytest
import torch

from glomo_pyg import Glomo, PretrainedGraphPredictor
from glomo_pyg.data import tokenize

SPECIALS = ["<pad>", "<unk>", "<bos>", "<eos>"]
LOWER = SPECIALS + ["the", "film", "was", "good", "."]


def predictor(vocabulary, **kwargs):
    torch.manual_seed(0)
    model = Glomo.text(num_tokens=len(vocabulary), hidden_channels=8, num_layers=1, heads=2,
                       cnn_layers=1)
    return model.to_pretrained(vocabulary=vocabulary, **kwargs)


def test_a_string_is_refused_unless_tokenize_splits_it():
    p = predictor(LOWER)
    for kwargs in ({}, dict(unknown="<unk>")):
        with pytest.raises(TypeError, match="not a string .*pass a list of tokens, or "
                                            "tokenize=True"):
            p.encode("the film", **kwargs)
    assert p.encode("The film was good.", tokenize=True).tolist() == \
        p.encode(tokenize("The film was good.")).tolist() == [4, 5, 6, 7, 8]
    with pytest.raises(TypeError, match="tokenize=True splits a text: give one string"):
        p.encode(["the", "film"], tokenize=True)


def test_a_token_not_in_the_vocabulary_names_unknown():
    p = predictor(LOWER)
    with pytest.raises(ValueError, match=r"1 of 2 tokens are not in the vocabulary "
                                         r"\('zorg'\): pass unknown=.*here unknown='<unk>'"):
        p.encode(["the", "zorg"])
    with pytest.raises(ValueError, match="unknown='<UNK>' is not in the vocabulary"):
        p.encode(["the"], unknown="<UNK>")
    assert p.encode(["the", "zorg"], unknown="<unk>").tolist() == [4, 1]
    features = PretrainedGraphPredictor(predictor(LOWER).predictor("forward"))
    with pytest.raises(ValueError, match="has no vocabulary"):
        features.encode(["the"])


def test_tokens_are_lower_cased_as_the_vocabulary_was_built(tmp_path):
    lower = predictor(LOWER)
    assert lower.lowercase is True  # inferred: no upper-case letter in the vocabulary
    assert lower.encode(["The", "FILM"]).tolist() == [4, 5]
    cased = predictor(SPECIALS + ["The", "the", "film"])
    assert cased.lowercase is False
    assert cased.encode(["The", "the"]).tolist() == [4, 5]
    with pytest.raises(ValueError, match="'Film'"):
        cased.encode(["Film"])
    kept = predictor(LOWER, lowercase=False)  # recorded: not inferred, and saved
    with pytest.raises(ValueError, match="'The'"):
        kept.encode(["The"])
    kept.save_pretrained(tmp_path / "kept")
    assert json.loads((tmp_path / "kept" / "config.json").read_text())["lowercase"] is False
    assert PretrainedGraphPredictor.from_pretrained(tmp_path / "kept").lowercase is False
    with pytest.raises(TypeError, match="lowercase must be True, False or None"):
        predictor(LOWER, lowercase="yes")


def test_the_released_vocabulary_is_read_lower_cased():
    released = PretrainedGraphPredictor.from_pretrained("imdb-text-cpu")
    assert released.lowercase is True  # (its config predates the record: inferred)
    ids = released.encode(["The", "Film"], unknown="<unk>").tolist()
    assert ids == released.encode(["the", "film"]).tolist() and 1 not in ids


def test_mostly_unknown_tokens_warn_once():
    p = predictor(LOWER)
    with pytest.warns(UserWarning, match=r"3 of 4 tokens are not in the vocabulary .*"
                                         r"tokenize=True") as caught:
        p.encode(["xx", "yy", "zz", "the"], unknown="<unk>")
    assert len(caught) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert p.encode(["xx", "the"], unknown="<unk>").tolist() == [1, 4]  # half: no warning
        assert p.encode([], unknown="<unk>").tolist() == []
