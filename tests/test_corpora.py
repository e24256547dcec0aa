"""Reading a pretraining corpus by its format (glomo_pyg.data.corpora)."""
import warnings

import pytest

from glomo_pyg.data import TextDataError
from glomo_pyg.data.corpora import read_corpus_documents, read_image_corpus
from glomo_pyg.training.pretrain import (
    CorpusConfig,
    PretrainConfig,
    TextPretrainingData,
    prepare_corpus,
)


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


REVIEWS = 'id,review,label\n1,"A fine film, and long.",1\n2,"Dull, ""very"" dull.\nTwo lines.",0\n'


def test_a_table_is_refused_without_its_column_and_read_with_it(tmp_path):
    csv_file = tmp_path / "reviews.csv"
    csv_file.write_text(REVIEWS)
    with pytest.raises(ValueError, match=r"reviews.csv is a CSV file \(columns: id, review, "
                                         r"label\).*header, ids and labels.*"
                                         r"--set corpus.column=review\)"):
        list(read_corpus_documents(str(csv_file)))
    assert list(read_corpus_documents(str(csv_file), column="review")) == [
        "A fine film, and long.", 'Dull, "very" dull.\nTwo lines.']
    tsv = tmp_path / "reviews.tsv"
    tsv.write_text("id\ttext\n1\tone review\n2\t\n3\tanother\n")  # (an empty cell: skipped)
    assert list(read_corpus_documents(str(tsv), column="text")) == ["one review", "another"]
    with pytest.raises(ValueError, match=r"corpus.column 'review': record 1 of .*reviews.tsv "
                                         r"has no such column \(its columns: id, text\)"):
        list(read_corpus_documents(str(tsv), column="review"))


def test_json_lines_are_found_by_name_or_by_their_first_line(tmp_path):
    lines = '{"id": 1, "review": "good film"}\n\n{"id": 2, "review": "bad film"}\n'
    for name in ("reviews.jsonl", "reviews.txt"):  # (.txt: its first line is a JSON object)
        (tmp_path / name).write_text(lines)
        with pytest.raises(ValueError, match=r"is a JSON-lines file \(columns: id, review\).*"
                                             r"corpus.column=review"):
            list(read_corpus_documents(str(tmp_path / name)))
        assert list(read_corpus_documents(str(tmp_path / name), column="review",
                                          max_documents=1)) == ["good film"]
    (tmp_path / "broken.jsonl").write_text('{"review": "ok"}\n[1, 2]\n')
    with pytest.raises(TextDataError, match=r"broken.jsonl:2: not a JSON object"):
        list(read_corpus_documents(str(tmp_path / "broken.jsonl"), column="review"))
    (tmp_path / "plain.txt").write_text("{braces} open a plain text\n")
    assert len(list(read_corpus_documents(str(tmp_path / "plain.txt")))) == 1


def test_a_column_needs_a_table_and_a_missing_path_names_the_setting(tmp_path):
    (tmp_path / "plain.txt").write_text("just text, with a comma\n")
    with pytest.raises(ValueError, match=r"corpus.column \('review'\) reads one CSV.*"
                                         r"is not a CSV, TSV or JSON-lines file"):
        list(read_corpus_documents(str(tmp_path / "plain.txt"), column="review"))
    with pytest.raises(ValueError, match="is a folder; remove corpus.column"):
        list(read_corpus_documents(str(tmp_path), column="review"))
    missing = tmp_path / "my_corpsu.txt"
    with pytest.raises(FileNotFoundError, match=r"^corpus.path: .*my_corpsu.txt does not "
                                                r"exist \(give a text file or folder"):
        list(read_corpus_documents(str(missing)))
    with pytest.raises(FileNotFoundError, match="^corpus.path: .* does not exist"):
        read_image_corpus(str(missing), "cifar10")
    with pytest.raises(ValueError, match="corpus.column names the column .* 'aclimdb'"):
        PretrainConfig.from_dict(dict(corpus=dict(format="aclimdb", column="review")))


def test_a_table_corpus_is_prepared_from_its_column(tmp_path):
    (tmp_path / "reviews.csv").write_text(REVIEWS)
    corpus = CorpusConfig(path=str(tmp_path / "reviews.csv"), column="review", min_count=1)
    vocab, _ = prepare_corpus(corpus, str(tmp_path / "run"))
    assert "film" in vocab and "label" not in vocab and "review" not in vocab


def test_one_document_and_no_validation_sequence_are_warned_about(tmp_path):
    text = " ".join(f"w{k % 7}" for k in range(400))
    (tmp_path / "book.txt").write_text(text.replace("w6", "w6\n"))
    corpus = CorpusConfig(path=str(tmp_path / "book.txt"), min_count=1)
    with pytest.warns(RuntimeWarning, match=r"book.txt is one file, read as one document .*"
                                            r"corpus.one_per_line=true") as caught:
        _, shards = prepare_corpus(corpus, str(tmp_path / "one"))
    assert len([w for w in caught if "one document" in str(w.message)]) == 1
    with pytest.warns(RuntimeWarning, match=r"corpus.validation_fraction 0.01 of 4 sequences "
                                            r"holds none: the run reports no validation loss"):
        TextPretrainingData(shards, 128, 8, 4, 0.01, 0).setup("fit")  # (not in __init__)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lines = CorpusConfig(path=str(tmp_path / "book.txt"), min_count=1, one_per_line=True)
        prepare_corpus(lines, str(tmp_path / "lines"))
        TextPretrainingData(shards, 128, 8, 4, 0.5, 0).setup("fit")
