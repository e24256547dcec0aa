"""Gold-tree readers and the syntax comparison of learned graphs."""
import json
import math
import os
import stat

import pytest
import torch

from glomo_pyg import DirectionalGraphs, Glomo, LatentGraphs
from glomo_pyg.analysis import (
    TreebankFormatError,
    align,
    compare_with_syntax,
    read_treebank,
    syntax_scores,
    untrained_copy,
)
from glomo_pyg.cli import main

CONLLU = """# newdoc id = d1
# sent_id = s1
# text = I saw U.S. ships
1\tI\tI\tPRON\tPRP\t_\t2\tnsubj\t_\t_
2\tsaw\tsee\tVERB\tVBD\t_\t0\troot\t_\t_
3\tU.S.\tU.S.\tPROPN\tNNP\t_\t4\tcompound\t_\t_
4\tships\tship\tNOUN\tNNS\t_\t2\tobj\t_\t_

# sent_id = s2
1-2\tcannot\t_\t_\t_\t_\t_\t_\t_\t_
1\tcan\tcan\tAUX\tMD\t_\t0\troot\t_\t_
2\tnot\tnot\tPART\tRB\t_\t1\tadvmod\t_\t_
2.1\tgo\tgo\tVERB\tVB\t_\t_\t_\t1:ok\t_
3\t.\t.\tPUNCT\t.\t_\t1\tpunct\t_\t_

"""
CONLLX = """1\tI\tI\tPRP\tPRP\t_\t2\tnsubj\t_\t_
2\tsaw\tsee\tVBD\tVBD\t_\t0\tROOT\t_\t_
3\tships\tship\tNNS\tNNS\t_\t2\tobj\t_\t_
"""


def write(tmp_path, text, name="t.conllu"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_conllu_reader_skips_ranges_empty_nodes_and_comments(tmp_path):
    trees = read_treebank(write(tmp_path, CONLLU))
    assert [t.words for t in trees] == [["I", "saw", "U.S.", "ships"], ["can", "not", "."]]
    assert trees[0].heads == [2, 0, 4, 2] and trees[1].heads == [0, 1, 1]
    assert trees[0].sent_id == "s1" and trees[0].line == 4
    assert trees[1].punct == [False, False, True]
    assert sorted(trees[0].arcs()) == [(1, 0), (1, 3), (3, 2)]
    assert len(read_treebank(write(tmp_path, CONLLU), max_sentences=1)) == 1


def test_conllx_reader(tmp_path):
    trees = read_treebank(write(tmp_path, CONLLX, "t.conll"))  # format from the extension
    assert trees[0].words == ["I", "saw", "ships"] and trees[0].heads == [2, 0, 2]
    assert trees[0].tags == ["PRP", "VBD", "NNS"]
    assert read_treebank(write(tmp_path, CONLLX, "t.txt"), format="conllx")[0].heads == [2, 0, 2]


@pytest.mark.parametrize("line, message", [
    ("3\tships\tship\tNNS\tNNS\t_\t2\tobj\t_", "expected 10 tab-separated columns"),
    ("3\tships\tship\tNNS\tNNS\t_\tx\tobj\t_\t_", "head"),
    ("3\tships\tship\tNNS\tNNS\t_\t_\tobj\t_\t_", "is not an integer"),
    ("3\tships\tship\tNNS\tNNS\t_\t7\tobj\t_\t_", "out of range"),
    ("3\tships\tship\tNNS\tNNS\t_\t3\tobj\t_\t_", "its own head"),
    ("5\tships\tship\tNNS\tNNS\t_\t2\tobj\t_\t_", "out of order"),
])
def test_malformed_lines_name_file_and_line(tmp_path, line, message):
    text = CONLLX.rsplit("\n", 2)[0] + "\n" + line + "\n"
    path = write(tmp_path, "# c\n" + text, "bad.conllu")
    with pytest.raises(TreebankFormatError, match=message) as err:
        read_treebank(path)
    assert f"{path}:4" in str(err.value)


def test_cycle_and_missing_root(tmp_path):
    cycle = ("1\ta\t_\tX\t_\t_\t2\t_\t_\t_\n2\tb\t_\tX\t_\t_\t1\t_\t_\t_\n"
             "3\tc\t_\tX\t_\t_\t0\t_\t_\t_\n")
    with pytest.raises(TreebankFormatError, match=r"cycle through words \[1, 2\]"):
        read_treebank(write(tmp_path, cycle))
    no_root = "1\ta\t_\tX\t_\t_\t2\t_\t_\t_\n2\tb\t_\tX\t_\t_\t1\t_\t_\t_\n"
    with pytest.raises(TreebankFormatError, match="no root"):
        read_treebank(write(tmp_path, no_root))
    with pytest.raises(TreebankFormatError, match="not UTF-8"):
        path = tmp_path / "latin1.conllu"
        path.write_bytes("1\t\xe9t\xe9\t_\tX\t_\t_\t0\t_\t_\t_\n".encode("latin-1"))
        read_treebank(str(path))
    with pytest.raises(ValueError, match="format"):
        read_treebank(write(tmp_path, CONLLX), format="xml")


# --- scores -------------------------------------------------------------------------------
VOCAB = ["<pad>", "<unk>", "<bos>", "<eos>", "i", "saw", "u", ".", "s", "ships"]


def tokens_of_first_sentence(tmp_path):
    tree = read_treebank(write(tmp_path, CONLLU), max_sentences=1)
    alignment = align(tree, VOCAB)
    sent = alignment.sentences[0]
    # "U.S." -> u . s . : four sub-tokens, the word is represented by its first
    assert sent.ids.tolist() == [4, 5, 6, 7, 8, 7, 9]
    assert sent.first.tolist() == [0, 1, 2, 6]
    assert sent.word_of.tolist() == [0, 1, 2, 2, 2, 2, 3]
    return alignment


class FixedGraphs(torch.nn.Module):
    """A stand-in predictor that returns the given dense [L, 1, H, T, T] graphs."""

    def __init__(self, forward=None, backward=None):
        super().__init__()
        self.blocks = dict(forward=forward, backward=backward)

    def forward(self, x, batch=None):
        ptr = torch.tensor([0, x.numel()])
        return DirectionalGraphs(*(None if self.blocks[d] is None else
                                   LatentGraphs.from_dense(self.blocks[d], direction=d, ptr=ptr)
                                   for d in ("forward", "backward")))


def forward_block():
    g = torch.zeros(1, 1, 1, 7, 7)  # [l, b, h, i (source), j (target)]
    g[..., 0, 1] = 1.0  # saw <- I
    g[..., 0, 2], g[..., 1, 2] = 0.3, 0.7  # U.S. <- saw (wrong)
    for i in range(3):  # non-first sub-tokens: ignored by the scores
        g[..., i, 3 + i] = 1.0
    g[..., 0, 6], g[..., 1, 6] = 0.05, 0.2  # ships <- U.S. (0.2 + 0.25 + 0.3 over 3 sub-tokens)
    g[..., 2, 6], g[..., 3, 6], g[..., 5, 6] = 0.2, 0.25, 0.3
    return g


def test_scores_against_hand_computed_values(tmp_path):
    alignment = tokens_of_first_sentence(tmp_path)
    scores = syntax_scores(FixedGraphs(forward_block()), alignment).directions["forward"]
    assert scores.targets == 3
    assert scores.per_graph["undirected"][0, 0] == pytest.approx(2 / 3)
    assert scores.per_graph["directed"][0, 0] == pytest.approx(0.0)
    # ranking 1.0(+) 0.75(+) 0.7(-) 0.3(-) 0.2(+) 0.05(-): AP = (1 + 1 + 3/5) / 3
    assert scores.per_graph["ap"][0, 0] == pytest.approx((1 + 1 + 0.6) / 3)
    prev = scores.baselines["previous word"]
    assert (prev["undirected"], prev["directed"]) == (pytest.approx(2 / 3), 0.0)
    uni = scores.baselines["uniform"]  # exact expectations: (1 + 0 + 2/3) / 3 and (1/3) / 3
    assert uni["undirected"] == pytest.approx(5 / 9)
    assert uni["directed"] == pytest.approx(1 / 9)
    assert uni["ap"] == pytest.approx(3 / 6)  # constant scores: the share of gold pairs
    # the best any forward graph can do: saw has I, ships has saw (its head) and U.S.;
    # U.S. has no gold neighbour before it; only ships has its head among its sources
    assert scores.baselines["upper bound"] == dict(undirected=pytest.approx(2 / 3),
                                                   directed=pytest.approx(1 / 3), ap=1.0)
    # the gold graph reaches it: saw <- I, ships <- saw (its head) over U.S. (its
    # dependent); U.S. attaches nowhere
    gold = torch.zeros(1, 1, 1, 7, 7)
    gold[..., 0, 1] = gold[..., 1, 6] = 1.0
    gold[..., 2, 6] = 0.5
    reached = syntax_scores(FixedGraphs(gold), alignment).directions["forward"]
    assert reached.per_graph["undirected"][0, 0] == pytest.approx(2 / 3)
    assert reached.per_graph["directed"][0, 0] == pytest.approx(1 / 3)
    assert reached.per_graph["ap"][0, 0] == pytest.approx(1.0)


def test_backward_next_token_lands_inside_a_split_word(tmp_path):
    alignment = tokens_of_first_sentence(tmp_path)
    g = torch.zeros(1, 1, 1, 7, 7)
    for j in range(6):
        g[..., j + 1, j] = 1.0  # next token
    scores = syntax_scores(FixedGraphs(backward=g), alignment).directions["backward"]
    # I <- saw (arc), saw <- "u" of U.S. (no arc), U.S. <- its own "." (self: no arc)
    assert scores.per_graph["undirected"][0, 0] == pytest.approx(1 / 3)
    nxt = scores.baselines["next word"]  # word level: I-saw, saw-U.S., U.S.-ships
    assert nxt["undirected"] == pytest.approx(2 / 3) and nxt["directed"] == pytest.approx(2 / 3)
    # backward: I (saw), saw (ships), U.S. (ships, its head) all have one after them
    assert scores.baselines["upper bound"] == dict(undirected=1.0, directed=pytest.approx(2 / 3),
                                                   ap=1.0)


def test_beyond_adjacent_scores_targets_whose_adjacent_word_is_no_gold_neighbour(tmp_path):
    alignment = tokens_of_first_sentence(tmp_path)
    g = torch.zeros(1, 1, 1, 7, 7)  # backward: sources after the target
    g[..., 6, 1], g[..., 2, 1] = 0.6, 0.4  # saw <- ships (gold) over U.S. (no arc)
    g[..., 1, 0] = 1.0  # I <- saw: a gold arc to the adjacent word, so not scored
    whole = syntax_scores(FixedGraphs(backward=g), alignment).directions["backward"]
    beyond = syntax_scores(FixedGraphs(backward=g), alignment,
                           beyond_adjacent=True).directions["backward"]
    # next word: I-saw (arc), saw-U.S. (no arc), U.S.-ships (arc): only "saw" remains
    assert (whole.targets, beyond.targets) == (3, 1)
    assert beyond.per_graph["undirected"][0, 0] == 1.0  # ships
    assert beyond.per_graph["directed"][0, 0] == 0.0  # saw is the root
    assert beyond.per_graph["ap"][0, 0] == pytest.approx(1.0)  # ships 0.6 (+) over U.S. 0.4
    assert beyond.baselines["next word"] == dict(undirected=0.0, directed=0.0,
                                                 ap=pytest.approx(0.5))
    uni = beyond.baselines["uniform"]  # sources U.S. and ships, one gold neighbour
    assert (uni["undirected"], uni["directed"], uni["ap"]) == (pytest.approx(0.5), 0.0,
                                                              pytest.approx(0.5))
    assert beyond.baselines["word two ahead"] == dict(undirected=1.0, directed=0.0,
                                                      ap=pytest.approx(1.0))  # ships
    assert "word two ahead" not in whole.baselines  # only beyond adjacency
    # every target scored beyond adjacency has a gold neighbour to find; saw is the root
    assert beyond.baselines["upper bound"] == dict(undirected=1.0, directed=0.0, ap=1.0)
    # through compare_with_syntax: the same targets for the choice and the report
    trees = read_treebank(write(tmp_path, CONLLU), max_sentences=1)
    result = compare_with_syntax(FixedGraphs(backward=g), trees, select_trees=trees,
                                 vocabulary=VOCAB, untrained=False, beyond_adjacent=True)
    assert result.evaluation.directions["backward"].targets == 1
    assert result.selection.directions["backward"].targets == 1
    assert "targets: only those with a gold neighbour" in result.format()
    assert result.to_dict()["evaluation"]["beyond_adjacent"] is True
    # forward: U.S. follows saw (no arc), but no earlier word is its gold neighbour either
    with pytest.raises(ValueError, match="no target to score in the forward direction.*"
                                         "no other gold neighbour"):
        syntax_scores(FixedGraphs(forward_block()), alignment, beyond_adjacent=True)


def test_head_averaged_graph_and_punctuation(tmp_path):
    alignment = tokens_of_first_sentence(tmp_path)
    second = torch.zeros(1, 1, 1, 7, 7)
    for j in range(1, 7):
        second[..., j - 1, j] = 1.0  # previous token
    both = torch.cat([forward_block(), second], 2)
    scores = syntax_scores(FixedGraphs(both), alignment).directions["forward"]
    mean = syntax_scores(FixedGraphs(both.mean(2, keepdim=True)), alignment).directions["forward"]
    for metric in ("undirected", "directed", "ap"):
        assert scores.per_layer[metric][0] == pytest.approx(mean.per_graph[metric][0, 0])
    # second head: previous token of "ships" is the last "." of U.S. -> the word U.S.
    assert scores.per_graph["undirected"][0, 1] == pytest.approx(2 / 3)
    punct = align(read_treebank(write(tmp_path, CONLLU))[1:], VOCAB + ["can", "not"])
    g = torch.zeros(1, 1, 1, 3, 3)
    g[..., 0, 1], g[..., 1, 2] = 1.0, 1.0
    with_p = syntax_scores(FixedGraphs(g), punct, exclude_punct=False).directions["forward"]
    without = syntax_scores(FixedGraphs(g), punct).directions["forward"]
    assert (with_p.targets, without.targets) == (2, 1)


def test_alignment_counts_unaligned_and_unknown(tmp_path):
    text = CONLLU.replace("U.S.\tU.S.", "\u00a0\tx")  # a word that tokenises to nothing
    alignment = align(read_treebank(write(tmp_path, text)), VOCAB)
    assert (alignment.skipped_sentences, alignment.unaligned_words) == (1, 1)
    assert len(alignment.sentences) == 1  # "can not ." (unknown words stay aligned)
    assert alignment.unknown_tokens == 2
    with pytest.raises(ValueError, match="no sentence"):
        syntax_scores(FixedGraphs(forward_block()), align([], VOCAB))
    with pytest.raises(ValueError, match="<unk>"):
        align([], ["a"])


def small_predictor(position=None):
    torch.manual_seed(0)
    model = Glomo.text(len(VOCAB) + 2, hidden_channels=16, num_layers=2, heads=2, cnn_layers=1,
                  position=position)
    return model.to_pretrained(VOCAB + ["can", "not"])


def test_compare_with_untrained_and_selection(tmp_path):
    trees = read_treebank(write(tmp_path, CONLLU))
    predictor = small_predictor()
    result = compare_with_syntax(predictor, trees, select_trees=trees)
    assert set(result.evaluation.directions) == {"forward", "backward"}
    assert result.untrained is not None and result.selection is not None
    text = result.format()
    assert "previous word" in text and "next word" in text and "untrained" in text
    json.dumps(result.to_dict())
    fresh = untrained_copy(predictor, seed=3)
    same = untrained_copy(predictor, seed=3)
    for (name, a), b in zip(fresh.state_dict().items(), same.state_dict().values()):
        assert torch.equal(a, b), name
    assert not all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(),
                                                     predictor.state_dict().values()))
    with pytest.raises(ValueError, match="metric"):
        compare_with_syntax(predictor, trees, metric="las")


def test_syntax_command(tmp_path, capsys):
    trees = write(tmp_path, CONLLU)
    folder = str(tmp_path / "predictor")
    small_predictor("relative").save_pretrained(folder)
    out = str(tmp_path / "scores" / "s.json")
    assert main(["syntax", "--predictor", folder, "--treebank", trees, "--select-treebank",
                 trees, "--json", out]) == 0
    text = capsys.readouterr().out
    assert "chosen graph" in text and "baseline: uniform" in text
    with open(out) as fh:
        data = json.load(fh)
    assert data["evaluation"]["directions"]["forward"]["targets"] == 4  # 3 + "not"
    assert not math.isnan(data["evaluation"]["directions"]["forward"]["baselines"]["uniform"]["ap"])
    with pytest.raises(SystemExit, match="no target to score in the forward direction"):
        main(["syntax", "--predictor", folder, "--treebank", trees, "--beyond-adjacent"])
    bad = write(tmp_path, "1\ta\n", "bad.conllu")
    with pytest.raises(SystemExit, match="bad.conllu:1"):
        main(["syntax", "--predictor", folder, "--treebank", bad])
    with pytest.raises(SystemExit, match="max-sentences"):
        main(["syntax", "--predictor", folder, "--treebank", trees, "--max-sentences", "0"])
    with pytest.raises(SystemExit):
        main(["syntax", "--predictor", str(tmp_path / "missing"), "--treebank", trees])
    assert os.path.exists(out)


def test_long_sentences_are_skipped_and_batches_bounded(tmp_path):
    trees = read_treebank(write(tmp_path, CONLLU))
    alignment = align(trees, VOCAB, max_tokens=5)  # "I saw U.S. ships" has 7 tokens
    assert alignment.long_sentences == 1 and len(alignment.sentences) == 1
    with pytest.raises(ValueError, match="max_tokens"):
        align(trees, VOCAB, max_tokens=1)
    from glomo_pyg.analysis.syntax import _batches
    sents = align(trees, VOCAB + ["can", "not"]).sentences * 5
    sents.sort(key=lambda s: s.ids.numel())
    sizes = [len(b) for b in _batches(sents, batch_size=4, scores=100)]
    assert sum(sizes) == 10 and max(sizes) <= 4
    assert all(len(b) * b[-1].ids.numel() ** 2 <= 100 or len(b) == 1
               for b in _batches(sents, batch_size=4, scores=100))


# --- hostile treebanks and options --------------------------------------------------------
def test_columns_are_split_on_tabs_only_and_a_bom_is_dropped(tmp_path):
    # conllu's own line parser also splits on two spaces: "New  York" would shift HEAD
    spaced = ("1\tNew  York\tx  y\tPROPN\t_\t_\t0\troot\t_\t_\n"
              "2\tgrows\tgrow\tVERB\t_\tA  B\t1\tdep\t_\t_\n")
    tree = read_treebank(write(tmp_path, spaced))[0]
    assert tree.words == ["New  York", "grows"] and tree.heads == [0, 1]
    path = tmp_path / "bom.conllu"
    path.write_bytes(b"\xef\xbb\xbf" + CONLLU.encode())
    assert [t.words for t in read_treebank(str(path))][0] == ["I", "saw", "U.S.", "ships"]


def test_not_utf8_names_the_line_and_byte_offset(tmp_path, monkeypatch):
    path = tmp_path / "late.conllu"
    good = (CONLLX + "\n") * 3
    path.write_bytes((good + "1\t\xe9\t_\tX\t_\t_\t0\t_\t_\t_\n").encode("latin-1"))
    with pytest.raises(TreebankFormatError, match=rf"late.conllu:13: not UTF-8 text \(byte "
                                                  rf"0xe9 at byte offset {len(good) + 2}\)"):
        read_treebank(str(path))
    import glomo_pyg.analysis.treebank as treebank
    monkeypatch.setattr(treebank, "MAX_LINE_BYTES", 64)
    long = write(tmp_path, CONLLX + "\n1\t" + "a" * 100 + "\t_\tX\t_\t_\t0\t_\t_\t_\n")
    with pytest.raises(TreebankFormatError, match=r":5: line longer than 64 bytes"):
        read_treebank(long)
    with pytest.raises(TreebankFormatError, match="is a directory"):
        read_treebank(str(tmp_path))


def test_punctuation_as_conllx_eval_and_withheld_forms(tmp_path):
    text = ("1\tTom\t_\tPROPN\t_\t_\t0\t_\t_\t_\n2\t&\t_\tCCONJ\t_\t_\t3\t_\t_\t_\n"
            "3\tJo\t_\tPROPN\t_\t_\t1\t_\t_\t_\n4\t%\t_\tSYM\t_\t_\t1\t_\t_\t_\n"
            "5\t!\t_\tPUNCT\t_\t_\t1\t_\t_\t_\n6\t?\t_\t_\t_\t_\t1\t_\t_\t_\n"
            "7\tand\t_\t$,\t_\t_\t1\t_\t_\t_\n")
    # a punctuation tag, or a form of punctuation characters only (CoNLL-X eval.pl)
    assert read_treebank(write(tmp_path, text))[0].punct == [False, True, False, True, True,
                                                            True, True]
    withheld = text
    for form in ("Tom", "&", "Jo", "%", "!", "?", "and"):
        withheld = withheld.replace(f"\t{form}\t", "\t_\t")
    trees = read_treebank(write(tmp_path, withheld))
    # "_" is a withheld form, not punctuation; the tags still decide
    assert trees[0].punct == [False] * 4 + [True, False, True]
    with pytest.raises(ValueError, match="withholds its words"):
        align(trees, VOCAB)


def test_trees_without_scorable_arcs_raise_instead_of_nan(tmp_path):
    roots = ("1\ti\t_\tX\t_\t_\t0\t_\t_\t_\n2\tsaw\t_\tX\t_\t_\t0\t_\t_\t_\n"
             "3\tships\t_\tX\t_\t_\t0\t_\t_\t_\n")  # three roots (CoNLL-X allows it)
    trees = read_treebank(write(tmp_path, roots, "roots.conll"))
    with pytest.raises(ValueError, match="no gold arc joins any scored forward"):
        syntax_scores(small_predictor(), align(trees, VOCAB))
    with pytest.raises(ValueError, match="no gold trees were given"):
        syntax_scores(small_predictor(), align([], VOCAB))
    good = read_treebank(write(tmp_path, CONLLU))
    from glomo_pyg.analysis.treebank import GoldTree
    skipped = [good[0], GoldTree(["x"], [0], ["X"])]  # 7 tokens > max_tokens; one word
    with pytest.raises(ValueError, match=r"evaluation trees: .*all 2 trees were skipped: 0 "
                                         r"with .*1 shorter.*1 longer than max_tokens=6"):
        compare_with_syntax(small_predictor(), skipped, max_tokens=6)
    with pytest.raises(ValueError, match="selection trees: .*no gold arc"):
        compare_with_syntax(small_predictor(), good, select_trees=trees, untrained=False)
    with pytest.raises(ValueError, match="selection trees: no sentence"):
        compare_with_syntax(small_predictor(), good, select_trees=skipped, max_tokens=6)
    with pytest.raises(ValueError, match="seed"):
        compare_with_syntax(small_predictor(), good, seed=1 << 70)


def test_syntax_command_refuses_bad_options_before_scoring(tmp_path, capsys):
    trees = write(tmp_path, CONLLU)
    folder = str(tmp_path / "predictor")
    small_predictor().save_pretrained(folder)
    base = ["syntax", "--predictor", folder, "--treebank", trees, "--no-untrained"]
    fifo = str(tmp_path / "out.fifo")
    os.mkfifo(fifo)
    for extra, message in [(["--threads", "-1"], r"--threads must be (an integer )?in \[0, 1024\]"),
                           (["--threads", "100000"],
                            r"--threads must be (an integer )?in \[0, 1024\]"),
                           (["--json", fifo], "not a regular file"),
                           (["--max-tokens", "1"], "--max-tokens must be an integer >= 2"),
                           (["--seed", str(10 ** 23)],
                            r"--seed must be an integer in \[-9223372036854775808, "
                            r"18446744073709551615\], got 1"),
                           (["--json", str(tmp_path)], "is a directory"),
                           (["--json", os.path.join(trees, "x.json")], "is a file, not a folder")]:
        with pytest.raises(SystemExit, match=message):
            main(base + extra)
        assert "gold trees" not in capsys.readouterr().out  # nothing was scored
    assert not any(name.endswith(".tmp") for name in os.listdir(tmp_path))
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)  # left as it was
    empty = write(tmp_path, "# only a comment\n\n\n", "empty.conllu")
    with pytest.raises(SystemExit, match="empty.conllu holds no sentences"):
        main(["syntax", "--predictor", folder, "--treebank", empty])
    with pytest.raises(SystemExit, match="empty.conllu holds no sentences"):
        main(base + ["--select-treebank", empty])


def test_syntax_monitor_words_only_data_faults_as_unscorable_trees(tmp_path):
    """SyntaxMonitor.check says "the gold trees cannot be scored" only when the trees
    leave nothing to score; an error of the model passes through as it is."""
    from glomo_pyg.analysis.syntax import NothingToScore
    from glomo_pyg.training.syntax_monitor import SyntaxMonitor

    model = Glomo.text(len(VOCAB) + 2, hidden_channels=16, num_layers=2, heads=2, cnn_layers=1)
    vocabulary = VOCAB + ["can", "not"]
    SyntaxMonitor(read_treebank(write(tmp_path, CONLLU)), vocabulary).check(model)  # scorable
    roots = ("1\ti\t_\tX\t_\t_\t0\t_\t_\t_\n2\tsaw\t_\tX\t_\t_\t0\t_\t_\t_\n")
    monitor = SyntaxMonitor(read_treebank(write(tmp_path, roots, "roots.conll")), vocabulary)
    with pytest.raises(ValueError, match="the gold trees cannot be scored: no gold arc") as err:
        monitor.check(model)
    assert not isinstance(err.value, NothingToScore)  # reworded, as a plain ValueError

    def broken(x, batch):
        raise ValueError("boom: the model's own fault")
    model.graphs = broken
    with pytest.raises(ValueError, match="^boom: the model's own fault$"):
        SyntaxMonitor(read_treebank(write(tmp_path, CONLLU)), vocabulary).check(model)
    # compare_with_syntax words the selection trees' faults, not the model's, likewise
    trees = read_treebank(write(tmp_path, CONLLU))
    calls = []

    def broken_on_selection(x, batch):
        calls.append(1)
        if len(calls) > 1:  # the evaluation trees are scored first
            raise ValueError("boom")
        return small_predictor()(x, batch)
    with pytest.raises(ValueError, match="^boom$"):
        compare_with_syntax(broken_on_selection, trees, vocabulary=vocabulary,
                            select_trees=trees, untrained=False)
