"""Reading a pretraining corpus by its format (glomo_pyg.data.corpora)."""
import pytest

from glomo_pyg.data.corpora import read_corpus_documents, read_image_corpus


def test_documents_of_a_folder_and_an_even_spread(tmp_path):
    for k in range(10):
        (tmp_path / f"doc{k:02d}.txt").write_text(f"document number {k}\n")
    docs = list(read_corpus_documents(str(tmp_path)))
    assert len(docs) == 10 and docs[3].startswith("document number 3")
    spread = list(read_corpus_documents(str(tmp_path), max_documents=4))
    assert [d.split()[2] for d in spread] == ["0", "2", "5", "7"]  # floor(k * 10 / 4)
    assert len(list(read_corpus_documents(str(tmp_path), max_documents=50))) == 10


def test_bad_settings_are_named(tmp_path):
    with pytest.raises(ValueError, match="corpus.path is not set"):
        list(read_corpus_documents(None))
    with pytest.raises(ValueError, match="format must be one of"):
        list(read_corpus_documents(str(tmp_path), format="cifar10"))
    with pytest.raises(ValueError, match="max_documents must be >= 1"):
        list(read_corpus_documents(str(tmp_path), max_documents=0))
    with pytest.raises(ValueError, match="corpus.path is not set"):
        read_image_corpus(None, "cifar10")
    with pytest.raises(ValueError, match="format must be one of"):
        read_image_corpus(str(tmp_path), "text")
