"""torch.compile: GlomoConv traces without graph breaks and matches eager mode."""
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
