"""torch.compile: GlomoConv traces without graph breaks and matches eager mode."""
import contextlib
import logging

import pytest
import torch

import glomo_pyg.kernels as F
from glomo_pyg import GlomoConv, GraphPredictor

dynamo = pytest.importorskip("torch._dynamo")


def setting(update):
    torch.manual_seed(0)
    predictor = GraphPredictor(num_tokens=20, hidden_channels=16, num_layers=1, heads=4,
                               cnn_layers=1)
    x = torch.randint(0, 20, (12,))
    batch = torch.tensor([0] * 5 + [1] * 7)
    ei, w, eh = predictor(x, batch).detach().layer(0)
    return GlomoConv(16, heads=4, update=update), torch.randn(12, 16), ei, w, eh


@pytest.mark.parametrize("update", [None, "gru", "residual"])
def test_glomo_conv_compiles_without_graph_breaks(update):
    conv, h, ei, w, eh = setting(update)
    explanation = dynamo.explain(conv)(h, ei, w, eh)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def test_compiled_glomo_conv_matches_eager_values_and_gradients():
    conv, h, ei, w, eh = setting("gru")
    dynamo.reset()
    compiled = torch.compile(conv, backend="aot_eager", fullgraph=True)
    h1, w1 = h.clone().requires_grad_(), w.clone().requires_grad_()
    h2, w2 = h.clone().requires_grad_(), w.clone().requires_grad_()
    eager_out, compiled_out = conv(h1, ei, w1, eh), compiled(h2, ei, w2, eh)
    torch.testing.assert_close(compiled_out, eager_out)
    probe = torch.randn_like(eager_out)
    (eager_out * probe).sum().backward()
    (compiled_out * probe).sum().backward()
    torch.testing.assert_close(h2.grad, h1.grad)
    torch.testing.assert_close(w2.grad, w1.grad)


def test_sparse_product_operator_registration():
    torch.manual_seed(0)
    row = torch.tensor([0, 0, 1, 3, 3, 3])
    col = torch.tensor([1, 2, 0, 0, 1, 2])
    weight = torch.rand(6, dtype=torch.float64, requires_grad=True)
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    torch.library.opcheck(F._spmm_op, (row, col, weight, x, 4))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_glomo_conv_on_unsorted_edges_matches_eager(backend):
    """Ordinary PyG input comes in any order: compiled and eager agree (the compiled
    path sorts, since it cannot inspect the order)."""
    conv, h, ei, w, eh = setting("residual")
    perm = torch.randperm(ei.size(1), generator=torch.Generator().manual_seed(1))
    ei, w, eh = ei[:, perm], w[perm], eh[perm]
    assert bool((eh[1:] * 100 + ei[1, 1:] < eh[:-1] * 100 + ei[1, :-1]).any())  # unsorted
    dynamo.reset()
    compiled = torch.compile(conv, backend=backend, fullgraph=True)
    want = conv(h, ei, w, eh)
    try:
        got = compiled(h, ei, w, eh)
    except Exception as err:  # inductor needs a working C++ toolchain
        if backend == "inductor" and "Compiler" in type(err).__name__ + str(err)[:200]:
            pytest.skip(f"inductor unavailable here: {err}")
        raise
    torch.testing.assert_close(got, want)


# A hostile graph given to a compiled layer: run in a child process, so that memory
# corruption (an abort) fails the test instead of killing the test run.
HOSTILE = r'''
import sys, torch
from glomo_pyg import GlomoConv
backend, case = sys.argv[1], sys.argv[2]
x = torch.randn(6, 4)
edges = dict(target=[[0, 1], [50, 2]], source=[[50, 1], [0, 2]], negative=[[-3, 1], [0, 2]],
             big=[[0, 1], [2 ** 40, 2]])
weight = torch.ones(2)
head = None
if case == "nan_weight":
    edge_index, weight = torch.tensor([[0, 1], [1, 2]]), torch.tensor([1.0, float("nan")])
elif case == "head":
    edge_index, head = torch.tensor([[0, 1], [1, 2]]), torch.tensor([0, 7])
else:
    edge_index = torch.tensor(edges[case])
conv = GlomoConv(4, heads=2 if case == "head" else 1)
compiled = torch.compile(conv, backend=backend, fullgraph=True)
good = torch.tensor([[0, 1], [1, 2]])
compiled(x, good, torch.ones(2), torch.zeros(2, dtype=torch.long) if case == "head" else None)
try:
    out = compiled(x, edge_index, weight, head)
except ValueError as err:
    print("REFUSED", err)
else:
    print("ACCEPTED", tuple(out.shape))
'''


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
@pytest.mark.parametrize("case,message", [
    ("target", "edge_index refers to nodes outside [0, 6) (ids from 0 to 50)"),
    ("source", "edge_index refers to nodes outside [0, 6) (ids from 0 to 50)"),
    ("negative", "edge_index refers to nodes outside [0, 6) (ids from -3 to 2)"),
    ("big", "edge_index refers to nodes outside [0, 6)"),
    ("nan_weight", "edge_weight contains NaN or Inf"),
    ("head", "edge_head values must lie in [0, 2), got values from 0 to 7"),
])
def test_a_compiled_layer_refuses_a_hostile_graph_like_eager_mode(backend, case, message):
    """Compiled code skips nothing that keeps memory safe: the eager error, never an
    out-of-bounds read (a finite result) or write (the process aborts)."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", HOSTILE, backend, case], capture_output=True,
                            text=True, timeout=600)
    if backend == "inductor" and result.returncode and "CppCompileError" in result.stderr:
        pytest.skip("inductor needs a working C++ toolchain")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("REFUSED") and message in result.stdout, result.stdout


def test_the_edge_check_operator_registration():
    x = torch.randn(3, 4)
    torch.library.opcheck(F.checked_edge_index,
                          (x, torch.tensor([[0, 1], [1, 2]]), torch.ones(2), None, 1))
    with pytest.raises(ValueError, match="outside"):
        F.checked_edge_index(x, torch.tensor([[0, 1], [1, 9]]), None, None, 1)


HOSTILE_KERNEL = r'''
import sys, torch
from glomo_pyg.kernels import head_propagate, weighted_spmm
backend, kernel = sys.argv[1], sys.argv[2]
x = torch.randn(6, 4)
if kernel == "weighted_spmm":
    fn = torch.compile(lambda col: weighted_spmm(torch.tensor([0, 1]), col, torch.ones(2), x, 6),
                       backend=backend)
    good, bad = torch.tensor([1, 2]), torch.tensor([1, 50])
else:
    fn = torch.compile(lambda ei: head_propagate(x, ei, torch.ones(2),
                                                 torch.zeros(2, dtype=torch.long), 1),
                       backend=backend)
    good, bad = torch.tensor([[0, 1], [1, 2]]), torch.tensor([[50, 1], [1, 2]])
fn(good)
try:
    out = fn(bad)
except ValueError as err:
    print("REFUSED", err)
else:
    print("ACCEPTED", tuple(out.shape))
'''


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["eager", "inductor"])
@pytest.mark.parametrize("kernel,message", [("weighted_spmm", "col holds ids outside [0, 6)"),
                                            ("head_propagate", "refers to nodes outside [0, 6)")])
def test_the_public_kernels_refuse_hostile_ids_when_compiled(backend, kernel, message):
    """Their index checks read values (a graph break under compile), so they still run."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", HOSTILE_KERNEL, backend, kernel],
                            capture_output=True, text=True, timeout=600)
    if backend == "inductor" and result.returncode and "CppCompileError" in result.stderr:
        pytest.skip("inductor needs a working C++ toolchain")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("REFUSED") and message in result.stdout, result.stdout


# Changing shapes: variable-length batches are the normal case.
LENGTHS = ([3, 4], [5, 2, 3], [2, 6, 3, 4], [7])  # batch sizes and lengths both change


def counting(backend):
    """A backend that compiles with ``backend`` and counts its compilations."""
    from torch._dynamo.backends.registry import lookup_backend

    calls = []

    def compile_graph(gm, example_inputs):
        calls.append(len(example_inputs))
        return lookup_backend(backend)(gm, example_inputs)

    return compile_graph, calls


def batches(device="cpu"):
    """Token batches of changing size with a small predictor's graphs for them."""
    torch.manual_seed(0)
    predictor = GraphPredictor(num_tokens=20, hidden_channels=8, num_layers=1, heads=2,
                               cnn_layers=1).to(device)
    for lens in LENGTHS:
        batch = torch.cat([torch.full((n,), i) for i, n in enumerate(lens)]).to(device)
        x = torch.randint(0, 20, (batch.numel(),), device=device)
        yield torch.randn(batch.numel(), 8, device=device), predictor(x, batch).detach()


def as_edges(graphs, edges):
    from torch_geometric import EdgeIndex

    ei, w, eh = graphs.layer(0)
    return (EdgeIndex(ei) if edges == "EdgeIndex" else ei), w, eh


@contextlib.contextmanager
def without_structured_trace():
    """Compile as a user's script does, without torch's structured trace. pytest's log
    capture hands the trace log handlers, so torch builds the trace's payloads; one of
    them prints the graph's inputs, and PyG's ``EdgeIndex.__repr__`` prints the values of
    a symbolic one, which specialises its edge count (a compilation per edge count, as
    under ``TORCH_TRACE``; docs/design.md, 'Compiling with changing shapes')."""
    trace = logging.getLogger("torch.__trace")
    handlers, trace.handlers = trace.handlers, []
    try:
        yield
    finally:
        trace.handlers = handlers


def check_changing_shapes(conv, backend, dynamic, edges, device="cpu"):
    with without_structured_trace():
        _check_changing_shapes(conv, backend, dynamic, edges, device)


def _check_changing_shapes(conv, backend, dynamic, edges, device):
    backend_fn, calls = counting(backend)
    dynamo.reset()
    compiled = torch.compile(conv, backend=backend_fn, fullgraph=True, dynamic=dynamic)
    for h, graphs in batches(device):
        ei, w, eh = as_edges(graphs, edges)
        h1, w1 = h.clone().requires_grad_(), w.clone().requires_grad_()
        h2, w2 = h.clone().requires_grad_(), w.clone().requires_grad_()
        got, want = compiled(h2, ei, w2, eh), conv(h1, ei, w1, eh)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
        probe = torch.randn_like(want)
        (want * probe).sum().backward()
        (got * probe).sum().backward()
        torch.testing.assert_close(h2.grad, h1.grad, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(w2.grad, w1.grad, atol=1e-5, rtol=1e-4)
    # automatic dynamic shapes: the first change recompiles once, dynamic=True never
    assert len(calls) <= (1 if dynamic else 2), calls


@pytest.mark.parametrize("dynamic", [True, None])
@pytest.mark.parametrize("edges", ["tensor", "EdgeIndex"])
def test_compiled_glomo_conv_follows_changing_batches(dynamic, edges):
    """fullgraph=True through batches of changing size: PyG's ``_check_input`` reads an
    EdgeIndex's sizes (SymInts under dynamic shapes), which GlomoConv skips while
    compiling; values and gradients equal eager mode."""
    check_changing_shapes(GlomoConv(8, heads=2, update="gru"), "aot_eager", dynamic, edges)


def test_compiled_glomo_conv_with_pyg_aggregation_follows_changing_batches():
    """The unfused path (PyG's gather/scatter) over changing batches."""
    check_changing_shapes(GlomoConv(8, heads=2, fused=False), "aot_eager", True, "tensor")


def test_eager_glomo_conv_keeps_pygs_input_check():
    conv = GlomoConv(8, heads=2)
    with pytest.raises(ValueError, match="size '2' in the first dimension"):
        conv._check_input(torch.zeros(3, 4, dtype=torch.long), None)
    with pytest.raises(ValueError, match="edge_index must have shape"):
        conv(torch.randn(4, 8), torch.zeros(3, 4, dtype=torch.long))


def test_compiled_glomo_conv_on_a_sized_edge_index_matches_eager():
    """An EdgeIndex given its sparse size: no graph break, eager values (its size is
    metadata that torch guards on exactly: a new size is a new compilation)."""
    from torch_geometric import EdgeIndex

    conv = GlomoConv(8, heads=2, update="residual")
    dynamo.reset()
    compiled = torch.compile(conv, backend="aot_eager", fullgraph=True, dynamic=True)
    for h, graphs in list(batches())[:2]:
        ei, w, eh = graphs.layer(0)
        ei = EdgeIndex(ei, sparse_size=(h.size(0), h.size(0)))
        torch.testing.assert_close(compiled(h, ei, w, eh), conv(h, ei, w, eh),
                                   atol=1e-5, rtol=1e-4)


def test_compiled_glomo_conv_on_a_pyg_batched_edge_index_matches_eager():
    """An EdgeIndex that PyG's Batch concatenated (sized, with each graph's sizes as
    metadata): no graph break, eager values and gradients."""
    from torch_geometric import EdgeIndex
    from torch_geometric.data import Batch, Data

    conv = GlomoConv(8, heads=2, update="gru")
    dynamo.reset()
    compiled = torch.compile(conv, backend="aot_eager", fullgraph=True)
    for h, graphs in list(batches())[:2]:
        ei, w, eh = graphs.layer(0)
        data = []
        for b, (lo, hi) in enumerate(zip(graphs.ptr[:-1].tolist(), graphs.ptr[1:].tolist())):
            own = graphs.batch[ei[1]] == b
            data.append(Data(edge_index=EdgeIndex(ei[:, own] - lo, sparse_size=(hi - lo,) * 2),
                             edge_weight=w[own], edge_head=eh[own], num_nodes=hi - lo))
        batch = Batch.from_data_list(data)
        assert isinstance(batch.edge_index, EdgeIndex)
        args = batch.edge_index, batch.edge_weight, batch.edge_head
        h1, h2 = h.clone().requires_grad_(), h.clone().requires_grad_()
        want, got = conv(h1, *args), compiled(h2, *args)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
        want.square().sum().backward()
        got.square().sum().backward()
        torch.testing.assert_close(h2.grad, h1.grad, atol=1e-5, rtol=1e-4)


def transfer_setting(device="cpu"):
    from glomo_pyg import GlomoTransfer, PretrainedGraphPredictor

    torch.manual_seed(0)
    parts = [GraphPredictor(num_tokens=20, hidden_channels=8, num_layers=1, heads=2,
                            cnn_layers=1, direction=d) for d in ("forward", "backward")]
    transfer = GlomoTransfer(PretrainedGraphPredictor(*parts), in_channels=4).to(device)
    inputs = []
    for lens in LENGTHS:
        batch = torch.cat([torch.full((n,), i) for i, n in enumerate(lens)]).to(device)
        x = torch.randint(0, 20, (batch.numel(),), device=device)
        inputs.append((torch.randn(batch.numel(), 4, device=device),
                       transfer.graphs(x, batch)))
    return transfer, inputs


def check_transfer_changing_shapes(backend, dynamic, device="cpu"):
    transfer, inputs = transfer_setting(device)
    backend_fn, calls = counting(backend)
    dynamo.reset()
    compiled = torch.compile(transfer, backend=backend_fn, fullgraph=True, dynamic=dynamic)
    for h, graphs in inputs:
        h1, h2 = h.clone().requires_grad_(), h.clone().requires_grad_()
        want, got = transfer(h1, graphs=graphs), compiled(h2, graphs=graphs)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
        want.square().sum().backward()
        got.square().sum().backward()
        torch.testing.assert_close(h2.grad, h1.grad, atol=1e-5, rtol=1e-4)
    assert len(calls) <= 2, calls  # at most one recompile, at the first change


@pytest.mark.parametrize("dynamic", [True, None])
def test_compiled_transfer_over_given_graphs_follows_changing_batches(dynamic):
    """GlomoTransfer over precomputed graphs: one trace for every batch (the graphs'
    derived index arrays are built in the compiled code, not keyed by object)."""
    check_transfer_changing_shapes("aot_eager", dynamic)


@pytest.mark.slow
@pytest.mark.parametrize("edges", ["tensor", "EdgeIndex"])
def test_inductor_glomo_conv_and_transfer_follow_changing_batches(edges):
    try:
        check_changing_shapes(GlomoConv(8, heads=2, update="gru"), "inductor", None, edges)
    except Exception as err:  # inductor needs a working C++ toolchain
        if "Compiler" in type(err).__name__ + str(err)[:200]:
            pytest.skip(f"inductor unavailable here: {err}")
        raise
    if edges == "tensor":
        check_transfer_changing_shapes("inductor", None)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dynamic", [True, None])
@pytest.mark.parametrize("edges", ["tensor", "EdgeIndex"])
def test_inductor_on_cuda_follows_changing_batches(dynamic, edges):
    check_changing_shapes(GlomoConv(8, heads=2, update="gru").cuda(), "inductor", dynamic,
                          edges, device="cuda")
    if edges == "tensor":
        check_transfer_changing_shapes("inductor", dynamic, device="cuda")
