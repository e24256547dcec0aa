"""Hostile input to the text readers: each gets a named error (a ValueError naming the
file, and the line for text formats) at the door, never a crash inside, a wrong result
or unbounded memory."""
import json
import os

import numpy as np
import pytest
import torch

from glomo_pyg.data import (
    TextDataError,
    TokenWindows,
    WordVocabulary,
    read_aclimdb,
    read_shard_index,
    read_text_documents,
    read_word_vectors,
    train_word_vectors,
    write_token_shards,
    write_word_vectors,
)

KINDS = ("pos", "neg", "unsup")


def _vectors(tmp_path, content, name="v.txt"):
    path = tmp_path / name
    (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    return str(path)


@pytest.mark.parametrize("content, message", [
    ("cat 1 2 3\ndog 4 5 6 7\n", r"v.txt:2: expected 3 numbers .* got 4 .*cannot contain spaces"),
    ("2 2\ncat 1 2 3\ndog 4 5 6\n", r"v.txt:2: expected 2 numbers .*set by line 1"),
    ("3 2\ncat 1 2\ndog 4 5\n", r"v.txt: the word2vec header \(line 1\) declares 3 vectors, "
                                r"the file has 2"),
    ("2 0\n", r"v.txt:1: .*dimension 0"),
    ("cat 1 2\ndog 1e39 0\n", r"v.txt:2: non-finite"),
    ("cat nan 2\n", r"v.txt:1: non-finite"),
    ("cat 1 -inf\n", r"v.txt:1: non-finite"),
    ("cat 1 2\n 1 2\n", r"v.txt:2: .*starts with a space"),
    ("cat\n", r"v.txt:1: expected a word and its numbers"),
    ("", r"v.txt: no word vectors"),
    (b"cat 1 2\ndog\xe9 3 4\n", r"v.txt:2: not UTF-8 text \(byte 0xe9 at byte offset 11\)"),
    (b"\x00\x01\xff\xfe" * 100, r"v.txt:1: not UTF-8"),
])
def test_word_vectors_refuse_malformed_files(tmp_path, content, message):
    with pytest.raises(TextDataError, match=message):
        read_word_vectors(_vectors(tmp_path, content))


def test_word_vectors_header_bom_and_limits(tmp_path):
    words, array = read_word_vectors(_vectors(tmp_path, "2 3\ncat 1 2 3\ndog 4 5 6\n"))
    assert words == ["cat", "dog"] and array.tolist() == [[1, 2, 3], [4, 5, 6]]
    words, _ = read_word_vectors(_vectors(tmp_path, "\ufeffcat 1 2\ndog 3 4\r\n".encode()))
    assert words == ["cat", "dog"]  # the byte-order mark is not part of the first word
    path = _vectors(tmp_path, "cat 1 2\ndog 3 4\n")
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="max_words must be None or an integer >= 1"):
            read_word_vectors(path, max_words=bad)
    assert read_word_vectors(path, max_words=np.int64(1))[0] == ["cat"]
    # a file without line ends (e.g. binary) is never read whole
    with pytest.raises(TextDataError, match=r"big.txt:1: line longer than"):
        read_word_vectors(_vectors(tmp_path, b"x" * ((1 << 20) + 10), "big.txt"))


def test_word_vectors_writing_and_training_refuse_nonsense(tmp_path):
    with pytest.raises(ValueError, match="nan or inf"):
        write_word_vectors(str(tmp_path / "w.txt"), ["a"], np.array([[np.inf]]))
    with pytest.raises(ValueError, match="cannot be written"):
        write_word_vectors(str(tmp_path / "w.txt"), ["a", 7], np.ones((2, 2)))
    assert not os.listdir(tmp_path)  # refused before anything is written
    docs = [["a", "b", "a"], ["b", "a"]]
    for key, value in [("dim", 0), ("dim", -3), ("dim", 2.5), ("window", 0),
                       ("min_count", 0), ("epochs", 0), ("workers", 0)]:
        with pytest.raises(ValueError, match=f"{key} must be an integer"):
            train_word_vectors(docs, **{"dim": 4, "min_count": 1, key: value})
    for empty in ([], [[], []]):
        with pytest.raises(ValueError, match="no tokens"):
            train_word_vectors(empty, dim=4, min_count=1)
    with pytest.raises(ValueError, match="no word occurs min_count=5"):
        train_word_vectors(docs, dim=4, min_count=5)
    with pytest.raises(ValueError, match="lists of str tokens"):
        train_word_vectors(["the cat sat", "a dog"], dim=4, min_count=1)


def test_aclimdb_refuses_ratings_outside_their_folder(tmp_path):
    folder = tmp_path / "aclImdb" / "train"
    for kind, name in (("pos", "1_8.txt"), ("neg", "2_3.txt"), ("unsup", "3_0.txt")):
        (folder / kind).mkdir(parents=True)
        (folder / kind / name).write_text("fine")
    assert [r.rating for r in read_aclimdb(str(tmp_path), "train", KINDS)] == [8, 3, 0]
    for kind, name, message in [("pos", "4_-7.txt", "rating -7 does not belong in pos/"),
                                ("pos", "4_3.txt", "rating 3 does not belong in pos/"),
                                ("neg", "4_11.txt", "rating 11 does not belong in neg/"),
                                ("unsup", "4_5.txt", "rating 5 does not belong in unsup/"),
                                ("neg", "-4_2.txt", "not an aclImdb review file name"),
                                ("neg", "4_2_1.txt", "not an aclImdb review file name")]:
        path = folder / kind / name
        path.write_text("x")
        with pytest.raises(TextDataError, match=f"{name}: {message}"):
            read_aclimdb(str(tmp_path), "train", KINDS)
        path.unlink()
    os.mkfifo(folder / "neg" / "4_2.txt")
    with pytest.raises(TextDataError, match="4_2.txt: not a regular file"):
        read_aclimdb(str(tmp_path), "train")
    os.remove(folder / "neg" / "4_2.txt")
    (folder / "neg" / "5_1.txt").write_bytes(b"caf\xe9")
    with pytest.raises(TextDataError, match=r"5_1.txt: not UTF-8 text .* offset 3"):
        read_aclimdb(str(tmp_path), "train")


def test_text_documents_not_utf8_bom_oversized_and_vocabulary_files(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"\xef\xbb\xbfone\r\ntwo\r\n\r\nthr\xffee\n")
    with pytest.raises(TextDataError, match=r"a.txt:4: not UTF-8 text \(byte 0xff at byte "
                                            r"offset 18\)"):
        list(read_text_documents(str(tmp_path / "a.txt"), one_per_line=True))
    with pytest.raises(TextDataError, match=r"a.txt: not UTF-8 .* offset 18"):
        list(read_text_documents(str(tmp_path)))
    assert list(read_text_documents(str(tmp_path), one_per_line=True, errors="replace")) == [
        "one\n", "two\n", "thr\ufffdee\n"]  # the BOM dropped, line ends as \n
    assert list(read_text_documents(str(tmp_path), errors="replace")) == [
        "one\ntwo\n\nthr\ufffdee\n"]
    with pytest.raises(TextDataError, match="more than 10 bytes in one document"):
        list(read_text_documents(str(tmp_path), errors="replace", max_bytes=10))
    with pytest.raises(TextDataError, match=r"a.txt:1: line longer than 3 bytes"):
        list(read_text_documents(str(tmp_path), one_per_line=True, max_bytes=3))
    with pytest.raises(ValueError, match="errors must be"):
        list(read_text_documents(str(tmp_path), errors="ignore"))
    os.mkfifo(tmp_path / "pipe.txt")  # would block forever if opened
    with pytest.raises(TextDataError, match="pipe.txt: not a regular file"):
        list(read_text_documents(str(tmp_path), errors="replace"))
    os.remove(tmp_path / "pipe.txt")
    for content, message in [('{"format": "glomo-vocabulary", "tokens": [1, {}]}',
                              "lists of strings"),
                             ('{"format": "glomo-vocabulary", "tokens": ["a", "a"]}',
                              "unique"),
                             ('[' * 100000, "not a readable vocabulary"),
                             (b"\xff\xfe", "not UTF-8")]:
        path = _vectors(tmp_path, content, "vocab.json")
        with pytest.raises(TextDataError, match=f"vocab.json: .*{message}"):
            WordVocabulary.load(path)


def _shards(tmp_path, name="shards"):
    docs = [torch.arange(10) % 7, torch.arange(6) % 7]
    write_token_shards(docs, str(tmp_path / name), vocab_size=7)
    return tmp_path / name


def _edit_index(folder, edit):
    index = json.loads((folder / "index.json").read_text())
    edit(index)
    (folder / "index.json").write_text(json.dumps(index))


def test_token_shards_confined_to_their_folder(tmp_path):
    folder = _shards(tmp_path)
    os.rename(folder / "tokens-00000.bin", tmp_path / "outside.bin")
    for bad in ["../outside.bin", str(tmp_path / "outside.bin"), "sub/x.bin", "..", "", 5,
                None, "x\ud800.bin", ".hidden", "a\0b"]:
        _edit_index(folder, lambda index, bad=bad: index["shards"][0].update(tokens=bad))
        with pytest.raises(TextDataError, match=r"index.json: shard 0: '\w+' must be a "
                                                r"plain file name"):
            TokenWindows.from_shards(str(folder), 4, 2)
    os.rename(tmp_path / "outside.bin", folder / "tokens-00000.bin")

    def twice(index):  # the same shard listed twice would double its documents
        index["shards"][0]["tokens"] = "tokens-00000.bin"
        index["shards"].append(dict(index["shards"][0]))
        index.update(num_tokens=32, num_documents=4)
    _edit_index(folder, twice)
    with pytest.raises(TextDataError, match="shard 1: 'tokens' must be .*used once"):
        read_shard_index(str(folder))
    os.rename(folder / "tokens-00000.bin", tmp_path / "outside.bin")
    os.symlink(tmp_path / "outside.bin", folder / "link.bin")  # a link leading out
    _edit_index(folder, lambda index: index["shards"][0].update(tokens="link.bin"))
    with pytest.raises(TextDataError, match="leads out of the shard folder"):
        read_shard_index(str(folder))


@pytest.mark.parametrize("edit, message", [
    (lambda i: i.update(version="1"), "'version' must be a positive integer"),
    (lambda i: i.pop("version"), "'version' must be a positive integer"),
    (lambda i: i.update(version=9), "format version 9 is newer"),
    (lambda i: i.pop("shards"), "'shards' must be a list"),
    (lambda i: i.update(shards={"a": 1}), "'shards' must be a list"),
    (lambda i: i["shards"].__setitem__(0, "x"), "shard 0 is not an object"),
    (lambda i: i["shards"][0].pop("num_tokens"), "shard 0: the count of its 'tokens'"),
    (lambda i: i["shards"][0].update(num_documents=-1), "shard 0: the count of its 'docs'"),
    (lambda i: i.update(vocab_size=0), "vocab_size 0 outside"),
    (lambda i: i.update(vocab_size=True), "'vocab_size' must be a non-negative integer"),
    (lambda i: i.update(num_tokens=99), "'num_tokens' 99 is not the sum"),
    (lambda i: i.update(token_dtype="<i8"), "'token_dtype' must be '<i4'"),
    (lambda i: i.clear(), "not a glomo-token-shards index"),
])
def test_token_shard_index_schema(tmp_path, edit, message):
    folder = _shards(tmp_path)
    _edit_index(folder, edit)
    with pytest.raises(TextDataError, match=f"index.json: {message}"):
        read_shard_index(str(folder))


def test_token_shards_corrupt_index_offsets_ids_and_empty_corpus(tmp_path):
    folder = _shards(tmp_path)
    for content in (b"{not json", b"\xff\xfe\x00", b"[" * 100000):
        (folder / "index.json").write_bytes(content)
        with pytest.raises(TextDataError, match="index.json: unreadable, not a JSON index"):
            read_shard_index(str(folder))
    # document offsets past the token count, or out of order
    for k, ends in enumerate(([10, 17], [16, 10], [-1, 16])):
        folder = _shards(tmp_path, f"ends{k}")
        np.asarray(ends, dtype="<i8").tofile(folder / "docs-00000.bin")
        with pytest.raises(TextDataError, match="tokens-00000.bin: its document end offsets"):
            TokenWindows.from_shards(str(folder), 4, 2)
    # token ids beyond the vocabulary stored in a shard: named when the window is read
    folder = _shards(tmp_path, "ids")
    np.asarray([0, 1, 2, 3, 99, 5, 6, 0, 1, 2, 3, 4, 5, 6, 0, 1], dtype="<i4").tofile(
        folder / "tokens-00000.bin")
    windows = TokenWindows.from_shards(str(folder), 4, 2)
    assert windows[0].x.tolist() == [0, 1, 2, 3]
    with pytest.raises(TextDataError, match=r"tokens-00000.bin: tokens 4..7 hold ids in "
                                            r"\[0, 99\], outside the vocabulary \[0, 7\)"):
        windows[1]
    # an empty corpus: refused when written, and named when an empty shard is opened
    with pytest.raises(ValueError, match="the corpus is empty"):
        write_token_shards([[], []], str(tmp_path / "empty"), vocab_size=5)
    assert not (tmp_path / "empty").exists()
    assert not [n for n in os.listdir(tmp_path) if ".partial" in n]  # nothing left behind
    folder = _shards(tmp_path, "emptied")
    (folder / "tokens-00000.bin").write_bytes(b"")
    (folder / "docs-00000.bin").write_bytes(np.zeros(2, "<i8").tobytes())
    _edit_index(folder, lambda i: (i.update(num_tokens=0), i["shards"][0].update(num_tokens=0)))
    with pytest.raises(TextDataError, match="emptied: the corpus is empty"):
        TokenWindows.from_shards(str(folder), 4, 2)



def test_word_vector_limits_that_would_hang_or_overflow(tmp_path):
    from glomo_pyg.data import embedding_matrix
    from glomo_pyg.data.word_vectors import MAX_DIM, MAX_WINDOW

    # a header claiming more numbers per line than any line may hold
    with pytest.raises(TextDataError, match=r"v.txt:1: .*dimension 999999999999999999"):
        read_word_vectors(_vectors(tmp_path, "0 999999999999999999\n"))
    docs = [["a", "b", "a"], ["b", "a"]]
    # gensim's C settings are 32-bit: a larger window killed a worker and training hung
    for key, value in [("window", MAX_WINDOW + 1), ("dim", MAX_DIM + 1)]:
        with pytest.raises(ValueError, match=rf"{key} must be an integer in \[1, "):
            train_word_vectors(docs, **{"dim": 4, "min_count": 1, key: value})
    for seed in (-1, 1 << 32):
        with pytest.raises(ValueError, match="seed must be an integer in"):
            train_word_vectors(docs, dim=4, min_count=1, seed=seed)
    # huge but finite vectors: their float32 std overflowed to inf rows for the other words
    words, vectors = ["good"], np.array([[1e30, -1e30, 1e30, -1e30]], dtype=np.float32)
    matrix, _ = embedding_matrix(["<pad>", "<unk>", "good", "bad"], words, vectors)
    assert torch.isfinite(matrix).all()
    # values or a scale that float32 cannot hold, and arguments of the wrong kind, are
    # refused (they made inf/NaN rows or crashed deep inside)
    vocab = ["<pad>", "good", "bad"]
    for args, kwargs, message in (
            ((vocab, ["good"], np.array([[3e38, -3e38]])), {}, "scale .* too large"),
            ((vocab, ["good"], np.full((1, 2), 1e300)), {}, "beyond float32's range"),
            ((vocab, ["good"], np.array([[np.nan, 1.0]])), {}, "NaN"),
            ((vocab, ["good", "bad", "x"], np.ones((1, 2))), {}, r"\[3, dim\], got \(1, 2\)"),
            ((vocab, ["good"], np.ones(2)), {}, r"got \(2,\)"),
            ((vocab, ["good"], [[1.0, 2.0]]), {}, "got list"),
            ((vocab, ["good"], np.ones((1, 2), dtype=np.int64)), {}, "floating-point"),
            (("good bad", ["good"], np.ones((1, 2))), {}, "vocabulary must be a sequence of str"),
            ((vocab, ["good"], np.ones((1, 2))), dict(scale=0), "scale must be a positive"),
            ((vocab, ["good"], np.ones((1, 2))), dict(scale=-5.0), "scale must be a positive")):
        with pytest.raises(ValueError, match=message):
            embedding_matrix(*args, **kwargs)
    assert torch.isfinite(embedding_matrix(vocab, ["good"], np.full((1, 2), 1e36))[0]).all()
    # a line the reader would refuse is not written; missing folders are created
    from glomo_pyg.data.word_vectors import MAX_EPOCHS, MAX_LINE_BYTES, MAX_TRAIN_DIM, MAX_WORKERS
    with pytest.raises(ValueError, match="1703938 bytes, more than the 1048576 a reader"):
        write_word_vectors(str(tmp_path / "wide.txt"), ["a"],
                           np.full((1, MAX_LINE_BYTES // 8), -1.234567e-05))
    assert not (tmp_path / "wide.txt").exists()
    widest = np.full((1, MAX_TRAIN_DIM), -1.234567e-05)  # what training may make: readable
    write_word_vectors(str(tmp_path / "new" / "folder" / "w.txt"), ["a"], widest)
    assert read_word_vectors(str(tmp_path / "new" / "folder" / "w.txt"))[1].shape == \
        (1, MAX_TRAIN_DIM)
    # (a typo of an epoch count would train for days rather than fail)
    for key, value in [("dim", MAX_TRAIN_DIM + 1), ("workers", MAX_WORKERS + 1),
                       ("epochs", MAX_EPOCHS + 1)]:
        with pytest.raises(ValueError, match=rf"{key} must be an integer in \[1, "):
            train_word_vectors(docs, **{"dim": 4, "min_count": 1, key: value})
    # a failed write leaves no temporary file behind
    (tmp_path / "out").mkdir()
    with pytest.raises(OSError):
        write_word_vectors(str(tmp_path / "out"), ["a"], np.ones((1, 2)))
    assert sorted(os.listdir(tmp_path)) == ["new", "out", "v.txt"]


def test_glomo_pretrain_names_an_empty_corpus_file(tmp_path):
    import yaml
    from pretrain_runs import pretrain_settings

    from glomo_pyg.cli import main

    (tmp_path / "empty.txt").write_bytes(b"")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(pretrain_settings(tmp_path / "run", tmp_path / "empty.txt")))
    with pytest.raises(SystemExit, match=r"^glomo pretrain: \S*empty\.txt: .*(no documents|"
                                         r"0 distinct words)"):
        main(["pretrain", "--config", str(cfg)])
