"""Tokenizer, vocabulary, readers (plain text, aclImdb, GloVe/word2vec), token shards."""
import json
import os

import numpy as np
import pytest
import torch

from glomo_pyg.data import (
    ResumableSampler,
    TokenWindows,
    WordVocabulary,
    embedding_matrix,
    read_aclimdb,
    read_shard_index,
    read_text_documents,
    read_word_vectors,
    tokenize,
    train_word_vectors,
    write_token_shards,
    write_word_vectors,
)


def test_tokenize_rules():
    text = "I didn't like it<br /><br />A well-known 1990s FILM!!! Really... (no)"
    assert tokenize(text) == ["i", "didn't", "like", "it", "a", "well-known", "1990s", "film",
                              "!", "really", ".", "(", "no", ")"]
    assert tokenize("Hello World", lower=False) == ["Hello", "World"]
    assert tokenize("café ﬁne") == ["café", "fine"]  # NFKC: the ligature is two letters
    assert tokenize("") == [] and tokenize("  \n\t ") == []
    assert tokenize("a<BR>b<br/>c") == ["a", "b", "c"]
    with pytest.raises(TypeError, match="str"):
        tokenize(b"bytes")


def test_vocabulary_build_order_limits_and_round_trip(tmp_path):
    docs = [["b", "a", "b", "c"], ["a", "b", "d"], ["z"]]
    vocab = WordVocabulary.build(docs, min_count=1)
    assert vocab.tokens()[:4] == ["<pad>", "<unk>", "<bos>", "<eos>"]
    assert vocab.tokens()[4:] == ["b", "a", "c", "d", "z"]  # count desc, then alphabetical
    assert WordVocabulary.build(docs, min_count=2).tokens()[4:] == ["b", "a"]
    assert WordVocabulary.build(docs, max_size=6).tokens()[4:] == ["b", "a"]
    ids = vocab.encode(["a", "never-seen", "z"])
    assert ids.dtype == torch.long and ids.tolist() == [5, vocab.unk_id, 8]
    assert vocab.decode(ids) == ["a", "<unk>", "z"]
    with pytest.raises(IndexError, match="outside the vocabulary"):
        vocab.decode([99])
    path = str(tmp_path / "vocab.json")
    vocab.save(path)
    assert WordVocabulary.load(path) == vocab
    (tmp_path / "bad.json").write_text('{"tokens": ["a"]}')
    with pytest.raises(ValueError, match="not a glomo vocabulary"):
        WordVocabulary.load(str(tmp_path / "bad.json"))
    (tmp_path / "broken.json").write_text('{"form')
    with pytest.raises(ValueError, match="not a readable vocabulary"):
        WordVocabulary.load(str(tmp_path / "broken.json"))
    with pytest.raises(ValueError, match="min_count"):
        WordVocabulary.build(docs, min_count=0)
    with pytest.raises(ValueError, match="special tokens"):
        WordVocabulary(["a", "b"])


def test_read_text_documents_files_folders_and_lines(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.txt").write_text("second file")
    (tmp_path / "sub" / "a.txt").write_text("nested file\n\nwith two lines")
    (tmp_path / "skip.md").write_text("not text")
    assert list(read_text_documents(str(tmp_path))) == ["second file",
                                                        "nested file\n\nwith two lines"]
    lines = list(read_text_documents(str(tmp_path / "sub" / "a.txt"), one_per_line=True))
    assert lines == ["nested file\n", "with two lines"]
    with pytest.raises(FileNotFoundError):
        list(read_text_documents(str(tmp_path / "missing")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no files"):
        list(read_text_documents(str(tmp_path / "empty")))


def _write_aclimdb(root):
    for split, kind, name, text in [("train", "pos", "3_9.txt", "great<br />film"),
                                    ("train", "pos", "10_7.txt", "good"),
                                    ("train", "neg", "1_2.txt", "bad"),
                                    ("train", "unsup", "5_0.txt", "unlabelled"),
                                    ("test", "pos", "0_10.txt", "test pos"),
                                    ("test", "neg", "2_1.txt", "test neg")]:
        folder = root / "aclImdb" / split / kind
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)


def test_read_aclimdb_layout_labels_and_errors(tmp_path):
    _write_aclimdb(tmp_path)
    train = read_aclimdb(str(tmp_path), "train")  # the parent of aclImdb works too
    assert [(r.text, r.label, r.rating, r.id) for r in train] == [
        ("great<br />film", 1, 9, 3), ("good", 1, 7, 10), ("bad", 0, 2, 1)]
    unsup = read_aclimdb(str(tmp_path / "aclImdb"), "train", ["unsup"])
    assert [(r.label, r.rating) for r in unsup] == [(-1, 0)]
    assert [r.label for r in read_aclimdb(str(tmp_path), "test")] == [1, 0]
    with pytest.raises(ValueError, match="only in train"):
        read_aclimdb(str(tmp_path), "test", ["unsup"])
    with pytest.raises(ValueError, match="split"):
        read_aclimdb(str(tmp_path), "dev")
    with pytest.raises(FileNotFoundError, match="official aclImdb layout"):
        read_aclimdb(str(tmp_path / "nowhere"), "train")
    (tmp_path / "aclImdb" / "train" / "pos" / "oops.txt").write_text("x")
    with pytest.raises(ValueError, match="file name"):
        read_aclimdb(str(tmp_path), "train")


def test_word_vectors_glove_and_word2vec_formats(tmp_path):
    words = ["the", "cat", "sat"]
    vectors = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    glove, w2v = str(tmp_path / "v.txt"), str(tmp_path / "v.w2v.txt")
    write_word_vectors(glove, words, vectors)
    write_word_vectors(w2v, words, torch.from_numpy(vectors), header=True)
    assert open(w2v).readline() == "3 4\n"
    for path in (glove, w2v):
        got_words, got = read_word_vectors(path)
        assert got_words == words
        np.testing.assert_allclose(got, vectors, rtol=1e-5)
    assert read_word_vectors(glove, vocabulary=["sat", "dog"])[0] == ["sat"]
    assert read_word_vectors(glove, max_words=2)[0] == ["the", "cat"]
    # a duplicate keeps the first vector; a word with a space (GloVe 840B) is refused
    (tmp_path / "odd.txt").write_text("x 3 4\nb 1 2\nx 5 6\n")
    odd_words, odd = read_word_vectors(str(tmp_path / "odd.txt"))
    assert odd_words == ["x", "b"] and odd.tolist() == [[3, 4], [1, 2]]
    (tmp_path / "space.txt").write_text("x 3 4\na b 1 2\n")
    with pytest.raises(ValueError, match=r"space.txt:2: .*cannot contain spaces"):
        read_word_vectors(str(tmp_path / "space.txt"))
    (tmp_path / "bad.txt").write_text("a 1 2\nb 1\n")
    with pytest.raises(ValueError, match=r"bad.txt:2: expected 2 numbers"):
        read_word_vectors(str(tmp_path / "bad.txt"))
    (tmp_path / "nan.txt").write_text("a 1 x\n")
    with pytest.raises(ValueError, match="non-numeric"):
        read_word_vectors(str(tmp_path / "nan.txt"))
    with pytest.raises(ValueError, match="cannot be written"):
        write_word_vectors(str(tmp_path / "w.txt"), ["two words"], vectors[:1])
    with pytest.raises(ValueError, match="one vector per word"):
        write_word_vectors(str(tmp_path / "w.txt"), words, vectors[:2])


def test_embedding_matrix_uses_file_vectors_and_zero_padding():
    vocab = ["<pad>", "<unk>", "cat", "dog"]
    weight, coverage = embedding_matrix(vocab, ["cat"], np.ones((1, 3), np.float32), seed=0)
    assert weight.shape == (4, 3) and coverage == 0.25
    assert weight[0].abs().sum() == 0 and torch.equal(weight[2], torch.ones(3))
    assert not torch.equal(weight[3], torch.zeros(3))


def test_train_word_vectors_learns_cooccurrence():
    gen = np.random.default_rng(0)
    # two topics: words of one topic co-occur only with each other
    docs = [[f"{t}{k}" for k in gen.integers(0, 5, 12)] for t in "ab" for _ in range(200)]
    words, vectors = train_word_vectors(docs, dim=16, window=4, min_count=1, epochs=10,
                                        workers=1, seed=0)
    assert vectors.shape == (10, 16)
    v = {w: vectors[i] / np.linalg.norm(vectors[i]) for i, w in enumerate(words)}
    same = np.mean([v["a0"] @ v[f"a{k}"] for k in range(1, 5)])
    other = np.mean([v["a0"] @ v[f"b{k}"] for k in range(5)])
    assert same > other + 0.2
    with pytest.raises(TypeError, match="re-iterable"):
        train_word_vectors(iter(docs), dim=4, min_count=1)


def _docs():
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, 50, (int(n),), generator=gen) for n in [0, 3, 17, 40, 5, 9, 64]]


def test_token_shards_stream_the_same_sequences_as_memory(tmp_path):
    docs = _docs()
    index = write_token_shards(docs, str(tmp_path / "shards"), vocab_size=50, shard_tokens=30)
    assert len(index["shards"]) >= 2 and index["num_tokens"] == sum(len(d) for d in docs)
    assert read_shard_index(str(tmp_path / "shards")) == index
    memory = TokenWindows.from_documents(docs, 50, max_length=8, min_length=3)
    shards = TokenWindows.from_shards(str(tmp_path / "shards"), max_length=8, min_length=3)
    assert len(memory) == len(shards) > 0
    got = [shards[k].x for k in range(len(shards))]
    assert all(torch.equal(memory[k].x, g) for k, g in enumerate(got))
    # independent expectation: each document cut into windows of 8, tails of >= 3 kept
    expected = [d[s:s + 8] for d in docs for s in range(0, len(d), 8) if len(d[s:s + 8]) >= 3]
    assert len(expected) == len(got) and all(torch.equal(e, g) for e, g in zip(expected, got))
    assert shards[0].x.dtype == torch.long
    with pytest.raises(IndexError):
        shards[len(shards)]


def test_token_shards_reject_bad_input_and_corrupt_files(tmp_path):
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 10\)"):
        write_token_shards([torch.tensor([1, 10])], str(tmp_path / "a"), vocab_size=10)
    assert not (tmp_path / "a").exists()  # nothing half-written left in place
    with pytest.raises(ValueError, match="1-D"):
        write_token_shards([torch.zeros(2, 2, dtype=torch.long)], str(tmp_path / "b"), 10)
    write_token_shards(_docs(), str(tmp_path / "ok"), vocab_size=50, shard_tokens=30)
    with pytest.raises(FileExistsError):
        write_token_shards(_docs(), str(tmp_path / "ok"), vocab_size=50)
    with open(tmp_path / "ok" / "tokens-00001.bin", "r+b") as fh:
        fh.truncate(8)
    with pytest.raises(ValueError, match="truncated or corrupt"):
        TokenWindows.from_shards(str(tmp_path / "ok"))
    os.remove(tmp_path / "ok" / "docs-00000.bin")
    with pytest.raises(ValueError, match="missing"):
        read_shard_index(str(tmp_path / "ok"))
    with pytest.raises(FileNotFoundError, match="not a token-shard folder"):
        read_shard_index(str(tmp_path))
    (tmp_path / "index.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match="not a glomo-token-shards index"):
        read_shard_index(str(tmp_path))
    with pytest.raises(ValueError, match="min_length"):
        TokenWindows.from_documents(_docs(), 50, max_length=8, min_length=1)


def test_resumable_sampler_order_ranks_and_skip():
    full = list(ResumableSampler(10, seed=3))
    assert sorted(full) == list(range(10)) and full != list(range(10))
    again = ResumableSampler(10, seed=3)
    again.skip = 4
    assert list(again) == full[4:]
    assert list(again) == full  # skip applies to one iteration only
    epoch1 = ResumableSampler(10, seed=3)
    epoch1.set_epoch(1)
    assert list(epoch1) != full
    ranks = [list(ResumableSampler(10, seed=3, num_replicas=3, rank=r)) for r in range(3)]
    assert all(len(r) == 4 for r in ranks)
    assert set(sum(ranks, [])) == set(range(10))
    assert list(ResumableSampler(5, shuffle=False)) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="no sequences"):
        ResumableSampler(0)
