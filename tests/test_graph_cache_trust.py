"""Graph caches that cannot be poisoned: ``GraphsDataset`` and ``GraphsOnDiskDataset``
serve a file only when its key and the SHA-256 of its whole content (recorded when it was
written) match; a flipped byte in any stored tensor, a changed dtype, another file's
tensors under this key, a FIFO at the file's path or a root that is a file are rebuilt
or refused by name, never read."""
import os
import signal
import threading

import pytest
import torch
from torch_geometric.data import Data

from glomo_pyg.transforms import GlomoGraphs, GraphsDataset, GraphsOnDiskDataset
from glomo_pyg.transforms.dataset import content_digest
from tests.test_transforms import Counting, make_text
from tests.test_transforms_dataset import assert_same, flip_byte, rich_samples


def stored(path):
    from safetensors import safe_open

    with safe_open(path, "pt") as f:
        return {k: f.get_tensor(k).clone() for k in f.keys()}, dict(f.metadata())


def rewrite(path, tensors, metadata):
    from safetensors.torch import save

    with open(path, "wb") as fh:
        fh.write(save(tensors, metadata=metadata))


@pytest.fixture
def built(tmp_path):
    p = make_text(0)
    counter = Counting(p)
    graphs = GlomoGraphs(p, top_k=2, batch_size=1)
    samples = rich_samples(5)
    ds = GraphsDataset(str(tmp_path), samples, graphs)
    # (copies: the dataset maps its file, which these tests then edit in place)
    want = [ds[i].clone() for i in range(len(ds))]
    counter.calls = 0
    return tmp_path, samples, graphs, counter, ds.processed_paths[0], want


def reopened_equal(built_):
    root, samples, graphs, counter, _, want = built_
    again = GraphsDataset(str(root), samples, graphs)
    for i, w in enumerate(want):
        assert_same(again[i], w)
    return counter.calls


@pytest.mark.parametrize("name", ["data.edge_weight", "data.edge_index", "data.edge_type",
                                  "slices.edge_index", "slices.x", "data.x"])
def test_a_flipped_byte_in_any_tensor_is_rebuilt(built, name):
    flip_byte(built[4], name)
    assert reopened_equal(built) == 5  # every sample's graphs made again
    assert reopened_equal(built) == 5  # (and then cached: no more calls)


def test_a_changed_dtype_under_the_valid_key_is_rebuilt(built):
    tensors, metadata = stored(built[4])
    tensors["data.edge_index"] = tensors["data.edge_index"].to(torch.int32)
    rewrite(built[4], tensors, metadata)
    assert reopened_equal(built) == 5
    root, samples, graphs = built[:3]
    assert GraphsDataset(str(root), samples, graphs)[0].edge_index.dtype == torch.int64


def test_another_files_tensors_under_this_key_are_rebuilt(built):
    root, samples, graphs, counter, path, _ = built
    other = GraphsDataset(str(root) + "-other", samples, GlomoGraphs(make_text(1), top_k=2))
    tensors, metadata = stored(other.processed_paths[0])
    key = stored(path)[1]["key"]
    rewrite(path, tensors, dict(metadata, key=key))  # its key renamed, content unchanged
    assert reopened_equal(built) == 5
    # (the digest binds the key: the other file's digest is not a digest under this key)
    assert content_digest(key, tensors) != metadata["content"]


def test_a_fifo_at_the_cache_path_is_replaced_without_waiting(built):
    path = built[4]
    os.unlink(path)
    os.mkfifo(path)

    def give_up(*_):
        raise TimeoutError("the dataset waited on a FIFO")

    old = signal.signal(signal.SIGALRM, give_up)
    signal.alarm(20)
    try:
        assert reopened_equal(built) == 5
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert os.path.isfile(path) and not os.path.islink(path)


def test_a_root_or_processed_folder_that_is_a_file_is_named(tmp_path):
    graphs = GlomoGraphs(make_text(0), top_k=2)
    samples = [Data(x=torch.arange(2, 6))]
    (tmp_path / "file").write_text("x")
    for cls in (GraphsDataset, GraphsOnDiskDataset):
        with pytest.raises(ValueError, match=r"root '.*file'.*is a file, not a folder"):
            cls(str(tmp_path / "file"), samples, graphs)
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "processed").write_text("x")
    for cls in (GraphsDataset, GraphsOnDiskDataset):
        with pytest.raises(ValueError, match=r"processed is a file, not a folder"):
            cls(str(tmp_path / "r"), samples, graphs)


def test_on_disk_a_chunk_replaced_after_opening_is_refused_by_name(tmp_path):
    graphs = GlomoGraphs(make_text(0), batch_size=1)
    samples = rich_samples(4)
    ds = GraphsOnDiskDataset(str(tmp_path), samples, graphs, chunk_size=2, cache_chunks=1)
    other = GraphsOnDiskDataset(str(tmp_path) + "-b", rich_samples(4, seed=9), graphs,
                                chunk_size=2)
    os.replace(other.chunk_path(1), ds.chunk_path(1))  # a valid chunk of other samples
    with pytest.raises(ValueError, match="was replaced since the dataset was opened"):
        ds[3]


def test_on_disk_a_fifo_chunk_is_made_again_without_waiting(tmp_path):
    graphs = GlomoGraphs(make_text(0), batch_size=1)
    samples = rich_samples(4)
    ds = GraphsOnDiskDataset(str(tmp_path), samples, graphs, chunk_size=2)
    want = [ds[i] for i in range(4)]
    os.unlink(ds.chunk_path(0))
    os.mkfifo(ds.chunk_path(0))
    done = {}
    worker = threading.Thread(target=lambda: done.setdefault(
        "ds", GraphsOnDiskDataset(str(tmp_path), samples, graphs, chunk_size=2)), daemon=True)
    worker.start()
    worker.join(30)
    if worker.is_alive():  # (unblock the reader so the test process can end)
        with open(ds.chunk_path(0), "wb"):
            pass
        pytest.fail("the dataset waited on a FIFO")
    for i in range(4):
        assert_same(done["ds"][i], want[i])


# ----------------------------------------------------------------------------- TextGraphCache

def text_cache(**variant):
    from glomo_pyg.transforms import TextGraphCache
    from tests.test_text_precompute import classifier, documents

    model = classifier(**variant)
    return model, TextGraphCache.compute(model, documents(), batch_size=3)


def rebuilt(cache, edit):
    """A cache of ``cache``'s settings whose first forward layer is ``edit``ed."""
    from glomo_pyg.transforms import TextGraphCache

    layers = {d: [dict(layer) for layer in ls] for d, ls in cache.layers.items()}
    layer = layers["forward"][0]
    edit(layer)
    return TextGraphCache(kind=cache.kind, lengths=cache.lengths, tokens=cache.tokens,
                          directions=cache.directions, num_layers=cache.num_layers,
                          heads=cache.heads, include_self=cache.include_self,
                          orders=cache.orders, max_distance=cache.max_distance,
                          fingerprint=cache.fingerprint, layers=layers)


def raise_count(layer):
    count = layer["count"].clone()
    count[0, 5] += 1
    layer["count"] = count


def beyond_document(layer):
    distance = layer["distance"].clone()
    distance[int(layer["start"][0, 4])] = 20  # (document 4 has 12 tokens)
    layer["distance"] = distance


def nan_weight(layer):
    weight = layer["weight"].clone()
    weight[3] = float("nan")
    layer["weight"] = weight


def shift_start(layer):
    start = layer["start"].clone()
    start[1, 4] += 1
    layer["start"] = start


def too_many_edges(layer):
    """Document 4's first token (no forward sources) given the edges of a later one."""
    count = layer["count"].clone()
    first = 5 + 1 + 9 + 3  # (document 4's first token: the lengths before it)
    later = first + int((count[0, first:first + 12] > 0).nonzero()[0])
    count[0, first], count[0, later] = count[0, later], 0
    layer["count"] = count


def doubled_weight(layer):
    weight = layer["weight"].clone()
    weight[:] = 0.9
    layer["weight"] = weight


def int_weights(layer):
    layer["weight"] = layer["weight"].to(torch.int64)


@pytest.mark.parametrize("edit,message", [
    (raise_count, "do not tile"), (beyond_document, "leave the document"),
    (nan_weight, r"outside \[0, 1\]"), (shift_start, "do not tile"),
    (too_many_edges, "more edges into a token"),
    (doubled_weight, "summing to more than 1"), (int_weights, "other dtypes")])
@pytest.mark.parametrize("check_edges", [None, 7])  # (7: the check in many small pieces)
def test_an_edited_text_cache_is_refused_by_name(edit, message, check_edges, monkeypatch):
    from glomo_pyg.transforms import text_cache as module

    if check_edges is not None:
        monkeypatch.setattr(module, "CHECK_EDGES", check_edges)
    _, cache = text_cache()
    rebuilt(cache, lambda layer: None)  # (unedited: accepted)
    with pytest.raises(ValueError, match=rf"graph cache, forward layer 0: .*({message}).*"
                                         r"compute it again"):
        rebuilt(cache, edit)


def test_a_text_cache_knows_a_predictor_with_permuted_rows():
    model, cache = text_cache()
    cache.check_model(model)
    p = model.transfer.predictor
    weight = next(w for name, w in p.named_parameters() if w.dim() == 2 and w.size(0) > 1)
    with torch.no_grad():
        weight.copy_(weight.flip(0))  # same sums and absolute sums, other graphs
    with pytest.raises(ValueError, match="another predictor's weights"):
        cache.check_model(model)


def test_a_text_cache_names_a_device_this_machine_lacks():
    from glomo_pyg.transforms import TextGraphCache
    from tests.test_text_precompute import classifier, documents

    for device, message in (("cuda:7", "cuda:7"), ("nonsense", "device must be None"),
                            ("meta", "meta device")):
        if device == "cuda:7" and torch.cuda.device_count() > 7:
            continue
        with pytest.raises(ValueError, match=message):
            TextGraphCache.compute(classifier(), documents(), device=device)
