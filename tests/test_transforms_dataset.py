"""glomo_pyg.transforms' datasets: what a PyG ``InMemoryDataset`` holds (numbers, strings,
lists) round trips, PyG's ``pre_filter`` / ``pre_transform`` hooks enter the key, nothing is
unpickled, and ``GraphsOnDiskDataset`` builds chunk by chunk (resumable), reads lazily and
equals the in-memory dataset sample for sample."""
import inspect
import os
import pickle

import pytest
import torch
from torch_geometric.data import Batch, Data, InMemoryDataset
from torch_geometric.loader import DataLoader

from glomo_pyg.transforms import ChainGraphs, GlomoGraphs, GraphsDataset, GraphsOnDiskDataset
from glomo_pyg.transforms.dataset import hook_identity
from tests.test_transforms import VOCAB, Counting, make_text


def rich_samples(n=7, seed=3):
    """Samples with every kind of attribute a PyG InMemoryDataset holds."""
    g = torch.Generator().manual_seed(seed)
    return [Data(x=torch.randint(0, VOCAB, (k % 4 + 1,), generator=g), y=k % 2, score=k / 4,
                 flag=k % 3 == 0, text=f"review {k}: é", tags=["a"] * (k % 3),
                 spans=[[k, k + 1], [0]], label=torch.tensor(k), pos=torch.rand(k % 4 + 1, 2,
                                                                                 generator=g))
            for k in range(n)]


class Reference(InMemoryDataset):
    """A plain PyG InMemoryDataset of given Data: what a PyG user gets."""

    def __init__(self, data_list):
        super().__init__(None)
        self.data, self.slices = self.collate(data_list)


def assert_same(got, want):
    """Equal attributes of equal types (tensors: dtype and values)."""
    assert set(got.keys()) == set(want.keys())
    for key in want.keys():
        a, b = got[key], want[key]
        assert type(a) is type(b), (key, a, b)
        if isinstance(b, torch.Tensor):
            assert a.dtype == b.dtype and torch.equal(a, b), (key, a, b)
        else:
            assert a == b, (key, a, b)


def assert_all_same(dataset, reference):
    assert len(dataset) == len(reference)
    for i in range(len(reference)):
        assert_same(dataset[i], reference[i])


# ----------------------------------------------------------------------------- GraphsDataset

@pytest.mark.parametrize("n", [1, 2, 7])
def test_non_tensor_attributes_round_trip_as_in_pyg(tmp_path, n):
    samples = rich_samples(n)
    graphs = ChainGraphs()
    reference = Reference(graphs(samples))
    assert_all_same(GraphsDataset(str(tmp_path), samples, graphs), reference)
    again = GraphsDataset(str(tmp_path), samples, graphs)  # read back from the file
    assert_all_same(again, reference)
    first = again[0]
    if n == 1:  # PyG keeps a lone sample as it was
        assert first.y == 0 and type(first.y) is int and type(first.score) is float
    else:
        assert torch.equal(first.y, torch.tensor([0])) and first.score.dtype == torch.float32
    assert first.text == "review 0: é" and first.tags == [] and first.spans == [[0, 1], [0]]


def test_the_key_covers_every_attribute(tmp_path):
    base = [Data(x=torch.arange(3), y=1), Data(x=torch.arange(2), y=0)]
    keys = set()
    for value in (1, 1.0, True, "1", [1], [1.0], torch.tensor(1), torch.tensor([1])):
        samples = [base[0].clone(), base[1].clone()]
        samples[0].y = value
        samples[1].y = type(value)(0) if not isinstance(value, (list, torch.Tensor)) else \
            value
        keys.add(GraphsDataset(str(tmp_path), samples, ChainGraphs()).key)
    assert len(keys) == 8
    a = GraphsDataset(str(tmp_path), [Data(x=torch.arange(3), text="good film")], ChainGraphs())
    b = GraphsDataset(str(tmp_path), [Data(x=torch.arange(3), text="good films")],
                      ChainGraphs())
    assert a.key != b.key and a[0].text == "good film" and b[0].text == "good films"


def test_refuses_what_it_cannot_give_back(tmp_path):
    graphs = ChainGraphs()

    def build(**attrs):
        return GraphsDataset(str(tmp_path), [Data(x=torch.arange(3), **attrs)], graphs)

    with pytest.raises(TypeError, match=r"'pair' is a tuple \(use a list\)"):
        build(pair=(1, 2))
    with pytest.raises(TypeError, match="'meta' is a dict.*never pickled"):
        build(meta={"a": 1})
    with pytest.raises(TypeError, match="'parts' is a list of tensors.*stack"):
        build(parts=[torch.zeros(2), torch.ones(2)])
    with pytest.raises(TypeError, match="'ids' is a list.*strings"):
        build(ids=["a", object()])
    with pytest.raises(TypeError, match="'adj' is a torch.sparse_coo tensor"):
        build(adj=torch.eye(3).to_sparse())
    with pytest.raises(ValueError, match=r"sample 1 has attributes \{x: tensor, y: string\}, "
                                         r"the first sample \{x: tensor, y: number\}"):
        GraphsDataset(str(tmp_path), [Data(x=torch.arange(3), y=1),
                                      Data(x=torch.arange(3), y="1")], graphs)
    with pytest.raises(ValueError, match="sample 1 has attributes"):
        GraphsDataset(str(tmp_path), [Data(x=torch.arange(3), y=1), Data(x=torch.arange(3))],
                      graphs)
    with pytest.raises(TypeError, match="samples must be a sequence"):
        GraphsDataset(str(tmp_path), Data(x=torch.arange(3)), graphs)
    with pytest.raises(TypeError, match="pre_transform must be callable"):
        GraphsDataset(str(tmp_path), [Data(x=torch.arange(3))], graphs, pre_transform=3)
    with pytest.raises(TypeError, match="pre_transform's output for kept sample 0: expected a "
                                        "torch_geometric Data, got Tensor"):
        GraphsDataset(str(tmp_path), [Data(x=torch.arange(3))], graphs,
                      pre_transform=lambda d: d.x)
    with pytest.raises(ValueError, match="pre_filter kept none of the 1 samples"):
        GraphsDataset(str(tmp_path), [Data(x=torch.arange(3))], graphs,
                      pre_filter=lambda d: False)
    assert not os.listdir(tmp_path / "processed") if (tmp_path / "processed").exists() else True


@pytest.mark.skipif("hetero" not in inspect.signature(GlomoGraphs).parameters,
                    reason="GlomoGraphs without a HeteroData output")
def test_refuses_heterodata_graphs_and_says_what_to_pass(tmp_path):
    graphs = GlomoGraphs(make_text(0), hetero=True)
    for cls in (GraphsDataset, GraphsOnDiskDataset):
        with pytest.raises(ValueError, match="hetero=False and transform=graphs.to_hetero"):
            cls(str(tmp_path), [Data(x=torch.arange(3))], graphs)


def encode_text(data):
    """A pre_transform: a text's words as token ids."""
    ids = [sum(map(ord, w)) % VOCAB for w in data.text.split()]
    return Data(x=torch.tensor(ids), y=data.y, text=data.text)


def text_samples():
    return [Data(text=t, y=i % 2) for i, t in enumerate(
        ["a good film", "bad", "", "the plot holds up well", "no", "very very good"])]


def keep_nonempty(data):
    return bool(data.text)


def test_pre_filter_drops_and_pre_transform_maps_before_the_graphs(tmp_path):
    p = make_text(0)
    counter = Counting(p)
    graphs = GlomoGraphs(p, batch_size=8)
    raw = text_samples()
    calls = []

    def pre_transform(data):
        calls.append(data.text)
        return encode_text(data)

    ds = GraphsDataset(str(tmp_path), raw, graphs, pre_transform=pre_transform,
                       pre_filter=keep_nonempty)
    want = graphs([encode_text(d) for d in raw if d.text])
    assert len(ds) == 5 and calls == [d.text for d in raw if d.text]
    assert_all_same(ds, Reference(want))
    # the same hooks: read back, neither the hooks nor the predictor run
    counter.calls, calls[:] = 0, []
    again = GraphsDataset(str(tmp_path), raw, graphs, pre_transform=pre_transform,
                          pre_filter=keep_nonempty)
    assert counter.calls == 0 and calls == [] and again.key == ds.key
    assert_all_same(again, Reference(want))
    # another filter or another transform: another key, made again
    other = GraphsDataset(str(tmp_path), raw, graphs, pre_transform=pre_transform,
                          pre_filter=lambda d: len(d.text) > 2)
    assert other.key != ds.key and len(other) == 4 and counter.calls == 1
    mapped = GraphsDataset(str(tmp_path), raw, graphs, pre_filter=keep_nonempty,
                           pre_transform=lambda d: Data(x=encode_text(d).x[:1], y=d.y))
    assert mapped.key not in (ds.key, other.key) and all(d.num_nodes == 1 for d in mapped)
    # transform on access, as in PyG
    on_access = GraphsDataset(str(tmp_path), raw, graphs, pre_transform=pre_transform,
                              pre_filter=keep_nonempty, transform=lambda d: Data(n=d.num_nodes))
    assert on_access.key == ds.key and [d.n for d in on_access] == [3, 1, 5, 1, 3]


def test_hook_identity_tells_functions_apart():
    def first(d):
        return d

    def second(d):
        return d.clone()

    assert hook_identity(None, "pre_filter") is None
    assert hook_identity(first, "f") == hook_identity(first, "f")
    assert hook_identity(first, "f") != hook_identity(second, "f")
    assert hook_identity(lambda d: True, "f") != hook_identity(lambda d: False, "f")
    assert "0x" not in hook_identity(ChainGraphs(), "f")


@pytest.fixture
def no_unpickling(monkeypatch):
    """Any unpickling (pickle, torch.load) fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("unpickled")

    for module, name in ((pickle, "load"), (pickle, "loads"), (torch, "load"),
                         (torch.serialization, "load")):
        monkeypatch.setattr(module, name, refuse)


def test_nothing_is_unpickled(tmp_path, no_unpickling):
    # a PyG InMemoryDataset would torch.load these (weights_only=False) to compare hooks
    (tmp_path / "processed").mkdir()
    for name in ("pre_transform.pt", "pre_filter.pt"):
        (tmp_path / "processed" / name).write_bytes(b"not read")
    raw = text_samples()
    for _ in range(2):  # built, then read back
        ds = GraphsDataset(str(tmp_path), raw, ChainGraphs(), pre_transform=encode_text,
                           pre_filter=keep_nonempty)
        disk = GraphsOnDiskDataset(str(tmp_path), raw, ChainGraphs(), chunk_size=2,
                                   pre_transform=encode_text, pre_filter=keep_nonempty)
        assert_all_same(disk, ds)
    assert sorted(os.listdir(tmp_path / "processed")) == sorted(
        ["pre_transform.pt", "pre_filter.pt", ds.processed_file_names[0],
         os.path.basename(disk.folder)])


# ----------------------------------------------------------------------------- on disk

@pytest.mark.parametrize("chunk_size", [1, 2, 3, 50])
def test_on_disk_equals_in_memory(tmp_path, chunk_size):
    samples = rich_samples(7)
    graphs = GlomoGraphs(make_text(0), batch_size=3)
    memory = GraphsDataset(str(tmp_path / "memory"), samples, graphs)
    disk = GraphsOnDiskDataset(str(tmp_path / "disk"), iter(samples), graphs,
                               chunk_size=chunk_size)
    assert len(os.listdir(disk.folder)) == -(-7 // chunk_size)
    # (graphs made in other batches agree to rounding; fixed graphs exactly)
    for i in range(7):
        got, want = disk[i], memory[i]
        torch.testing.assert_close(got.edge_weight, want.edge_weight, atol=1e-5, rtol=1e-4)
        got.edge_weight = want.edge_weight
        assert_same(got, want)
    assert disk.relations == graphs.relations
    chain = GraphsOnDiskDataset(str(tmp_path / "chain"), samples, ChainGraphs(),
                                chunk_size=chunk_size)
    assert_all_same(chain, Reference(ChainGraphs()(samples)))


def test_on_disk_reads_lazily_and_keeps_few_chunks_open(tmp_path):
    ds = GraphsOnDiskDataset(str(tmp_path), rich_samples(9), ChainGraphs(), chunk_size=2,
                             cache_chunks=2)
    assert len(ds) == 9 and not ds._cache  # opening reads no sample
    assert ds[5].text == "review 5: é"
    assert list(ds._cache) == [2]  # only sample 5's chunk
    for i in (0, 8, 3):
        ds[i]
    assert list(ds._cache) == [4, 1]  # the two most recent
    with pytest.raises(IndexError, match="index 9 is out of range for 9 samples"):
        ds.get(9)
    assert ds[-1].text == "review 8: é"
    subset = ds[[8, 1]]  # PyG's index_select
    assert [d.text for d in subset] == ["review 8: é", "review 1: é"]


def few_attributes(data):
    """A transform on access."""
    return Data(x=data.x, y=data.y, edge_index=data.edge_index)


def test_on_disk_with_dataloader(tmp_path):
    samples = rich_samples(10)
    ds = GraphsOnDiskDataset(str(tmp_path), lambda: iter(samples), ChainGraphs(),
                             chunk_size=3, transform=few_attributes)
    want = Batch.from_data_list([Data(x=d.x, y=torch.tensor([d.y]),
                                      edge_index=d.edge_index)
                                 for d in ChainGraphs()(samples)])
    for workers in (0, 1):
        batches = list(DataLoader(ds, batch_size=4, num_workers=workers))
        assert [b.num_graphs for b in batches] == [4, 4, 2]
        got = Batch.from_data_list([d for b in batches for d in b.to_data_list()])
        for key in ("x", "y", "edge_index", "batch"):
            assert torch.equal(got[key], want[key]), key
    assert sorted(ds[9].keys()) == ["edge_index", "x", "y"] and ds._cache
    copied = pickle.loads(pickle.dumps(ds))  # (what spawned workers receive)
    assert not copied._cache and torch.equal(copied[9].x, ds[9].x)


class Interrupted(Exception):
    pass


def interrupted_after(samples, n):
    yield from samples[:n]
    raise Interrupted


def test_on_disk_resumes_after_an_interrupted_build(tmp_path):
    p = make_text(0)
    counter = Counting(p)
    graphs = GlomoGraphs(p, batch_size=1)
    samples = rich_samples(7)
    with pytest.raises(Interrupted):
        GraphsOnDiskDataset(str(tmp_path), interrupted_after(samples, 5), graphs, chunk_size=2)
    assert counter.calls == 4  # chunks 0 and 1 were written; chunk 2 was never complete
    counter.calls = 0
    ds = GraphsOnDiskDataset(str(tmp_path), samples, graphs, chunk_size=2)
    assert counter.calls == 3  # chunks 2 and 3 made, 0 and 1 reused
    assert sorted(os.listdir(ds.folder)) == [f"chunk-00000{i}.safetensors" for i in range(4)]
    counter.calls = 0
    again = GraphsOnDiskDataset(str(tmp_path), iter(samples), graphs, chunk_size=2)
    assert counter.calls == 0 and again.key == ds.key
    assert_all_same(again, ds)
    # fewer samples: chunk 1 made again (one sample of two), those past the end removed
    fewer = GraphsOnDiskDataset(str(tmp_path), samples[:3], graphs, chunk_size=2)
    assert counter.calls == 1 and len(fewer) == 3 and fewer.key != ds.key
    assert sorted(os.listdir(ds.folder)) == ["chunk-000000.safetensors",
                                             "chunk-000001.safetensors"]
    folder = ds.folder
    # another chunk size or transform: another folder
    other = GraphsOnDiskDataset(str(tmp_path), samples, graphs, chunk_size=3)
    assert other.folder != folder


def flip_byte(path, name):
    """Flip one byte inside the stored bytes of tensor ``name`` (the file stays valid
    safetensors with the same header)."""
    import json

    with open(path, "r+b") as fh:
        header = int.from_bytes(fh.read(8), "little")
        start, end = json.loads(fh.read(header))[name]["data_offsets"]
        fh.seek(8 + header + (start + end) // 2)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0x5A]))


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty", "other_key", "missing",
                                    "data.edge_weight", "slices.edge_index", "json.text"])
def test_on_disk_rebuilds_a_damaged_chunk(tmp_path, damage):
    from safetensors.torch import save

    p = make_text(0)
    counter = Counting(p)
    graphs = GlomoGraphs(p, batch_size=1)
    samples = rich_samples(6)
    ds = GraphsOnDiskDataset(str(tmp_path), samples, graphs, chunk_size=2)
    want = [ds[i] for i in range(6)]
    path = ds.chunk_path(1)
    size = os.path.getsize(path)
    if damage == "truncate":
        with open(path, "r+b") as fh:
            fh.truncate(size - 3)
    elif damage == "garbage":
        with open(path, "wb") as fh:
            fh.write(bytes((i * 37 + 11) % 256 for i in range(size)))
    elif damage == "empty":
        open(path, "wb").close()
    elif damage == "other_key":
        with open(path, "wb") as fh:
            fh.write(save({"data.x": torch.zeros(2)}, metadata={"key": "0" * 32}))
    elif damage == "missing":
        os.unlink(path)
    else:  # one byte flipped inside a stored tensor: the file still reads as safetensors
        flip_byte(path, damage)
    counter.calls = 0
    again = GraphsOnDiskDataset(str(tmp_path), samples, graphs, chunk_size=2)
    assert counter.calls == 2  # chunk 1's two samples, the others reused
    for i in range(6):
        assert_same(again[i], want[i])


def test_on_disk_refuses_bad_input(tmp_path):
    graphs, root = ChainGraphs(), str(tmp_path)
    x = torch.arange(3)
    with pytest.raises(ValueError, match="needs at least one sample"):
        GraphsOnDiskDataset(root, [], graphs)
    with pytest.raises(ValueError, match="needs at least one sample"):
        GraphsOnDiskDataset(root, iter(()), graphs)
    for bad in (0, -1, True, 1.5, "2", None):
        with pytest.raises(ValueError, match=f"chunk_size must be a positive integer, got "
                                             f"{bad!r}"):
            GraphsOnDiskDataset(root, [Data(x=x)], graphs, chunk_size=bad)
    with pytest.raises(ValueError, match="cache_chunks must be a positive integer, got 0"):
        GraphsOnDiskDataset(root, [Data(x=x)], graphs, cache_chunks=0)
    for bad in (3, "abc", Data(x=x), lambda: 3):
        with pytest.raises(TypeError, match="samples must be an iterable of torch_geometric "
                                            "Data or a function"):
            GraphsOnDiskDataset(root, bad, graphs)
    with pytest.raises(TypeError, match="sample 3: expected a torch_geometric Data, got Tensor"):
        GraphsOnDiskDataset(root, [Data(x=x)] * 3 + [x], graphs, chunk_size=2)
    with pytest.raises(ValueError, match="sample 2 has attributes"):  # (across chunks)
        GraphsOnDiskDataset(root, [Data(x=x, y=1)] * 2 + [Data(x=x, y="1")], graphs,
                            chunk_size=2)
    with pytest.raises(TypeError, match="graphs must be a graph transform"):
        GraphsOnDiskDataset(root, [Data(x=x)], lambda d: d)
    with pytest.raises(ValueError, match="pre_filter kept none of the 3 samples"):
        GraphsOnDiskDataset(root, [Data(x=x)] * 3, graphs, pre_filter=lambda d: False)


def test_on_disk_filters_per_chunk(tmp_path):
    raw = text_samples()  # the empty text is sample 2: chunk 1 keeps one of two
    ds = GraphsOnDiskDataset(str(tmp_path), raw, ChainGraphs(), chunk_size=2,
                             pre_filter=keep_nonempty, pre_transform=encode_text)
    assert_all_same(ds, Reference(ChainGraphs()([encode_text(d) for d in raw if d.text])))
    only = GraphsOnDiskDataset(str(tmp_path), raw, ChainGraphs(), chunk_size=1,
                               pre_filter=lambda d: d.text == "no", pre_transform=encode_text)
    assert len(only) == 1 and only[0].text == "no"  # (empty chunks are skipped)
