r"""GraphLearning: a graph learned per sample from its node features, for the task at
hand (PICK, Yu et al. ICPR 2020, Sec. III-C, after GLCN, Jiang et al. CVPR 2019); the
family of graph learners that GLoMo's pretrained graphs are compared with
(docs/any_gnn.md, "Two families of graph learners")."""
from __future__ import annotations

from typing import List, NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from glomo_pyg.graphs.pruning import TOP_K, prune_rows
from glomo_pyg.ordering import RasterOrder, UnitOrder
from glomo_pyg.sequences import (
    SequenceBatch,
    check_dtype,
    check_features,
    first_failure,
    sequence_batch,
)
from glomo_pyg.settings import Rule, check_int

#: ``eta`` and ``gamma``: finite numbers >= 0.
LOSS_WEIGHT = Rule(float, low=0)
#: Elements of one chunk's ``[B, targets, sources, channels]`` differences.
CHUNK_ELEMENTS = 1 << 22


class LearnedGraph(NamedTuple):
    """A batch's learned graph: PyG edges ``source -> target`` sorted by (target, source),
    their weights :math:`A_{ij}` (target :math:`i`, source :math:`j`) and :math:`L_{GL}`
    averaged over the samples."""

    edge_index: Tensor
    edge_weight: Tensor
    loss: Tensor


class GraphLearning(torch.nn.Module):
    r"""Learns one graph per sample from its node features :math:`\mathbf{v}_1 \ldots
    \mathbf{v}_N` (PICK's graph learning, Yu et al. 2020, Eqs. 4-5):

    .. math::
        A_{ij} = \mathrm{softmax}_{j \in \mathcal{S}(i)}(e_{ij}), \qquad
        e_{ij} = \mathrm{LeakyReLU}(\mathbf{w}^\top |\mathbf{v}_i - \mathbf{v}_j|)

    so :math:`\sum_j A_{ij} = 1` over the allowed sources :math:`\mathcal{S}(i)` of target
    :math:`i` (every unit of the sample with ``order=None``, PICK's; the sources a
    :class:`~glomo_pyg.SequenceOrder` or :class:`~glomo_pyg.RasterOrder` allows, to
    compare with GLoMo's directional graphs). The PyG edge :math:`j \to i` carries
    :math:`A_{ij}` (GLoMo's :math:`G_{ij}` is indexed source first: :math:`A = G^\top`).
    With ``top_k`` each target keeps its ``top_k`` heaviest sources (the pruning of
    :mod:`glomo_pyg.transforms`: ties to the lower source, weights not renormalised).

    The graph-learning loss, to be added to the task's, is computed on the edges
    returned and averaged over the samples :math:`b`:

    .. math::
        L_{GL} = \frac{1}{B} \sum_b \Big( \frac{1}{N_b^2} \sum_{(j \to i) \in E_b}
        \exp\big(A_{ij} + \eta \lVert \mathbf{v}_i - \mathbf{v}_j \rVert^2\big)
        + \gamma \sum_{(j \to i) \in E_b} A_{ij}^2 \Big)

    (the second term is :math:`\gamma \lVert A \rVert_F^2`). Without ``top_k`` the
    edges are exactly the allowed pairs, whatever their weights, so a pair whose
    :math:`A_{ij}` underflows to 0 stays an edge and :math:`L_{GL}` is the paper's sum over
    all of them; with ``top_k`` a weight of 0 is never kept, as in the transforms' pruning.
    The exponent grows with the squared distance of features: give features of bounded
    norm (e.g. normalised) or a small ``eta``, or the loss overflows.

    Targets are taken in chunks of about :data:`CHUNK_ELEMENTS` pairwise differences;
    under autograd each chunk is recomputed in the backward pass, so memory holds the
    edges returned and one chunk, never the ``[B, N, N, C]`` differences.

    Args:
        in_channels (int): width :math:`C` of the node features.
        order (UnitOrder, optional): allowed sources; ``None``: every unit of the sample,
            itself included. (default: :obj:`None`)
        top_k (int, optional): keep the heaviest ``top_k`` sources per target.
            (default: :obj:`None`, all)
        eta (float): :math:`\eta` of :math:`L_{GL}`. (default: :obj:`1.0`)
        gamma (float): :math:`\gamma` of :math:`L_{GL}`. (default: :obj:`1.0`)
        negative_slope (float): LeakyReLU's slope. (default: :obj:`0.01`)
        chunk_elements (int, optional): elements per chunk. (default: :data:`CHUNK_ELEMENTS`)

    Shapes:
        - **input:** node features :math:`(N, C)`, finite; ``batch`` :math:`(N)` sorted
          (default: one sample); with a :class:`~glomo_pyg.RasterOrder`, every sample
          has ``height * width`` units in raster order
        - **output:** :class:`LearnedGraph`: ``edge_index`` :math:`(2, E)`,
          ``edge_weight`` :math:`(E)`, ``loss`` a scalar
    """

    def __init__(self, in_channels: int, order: Optional[UnitOrder] = None,
                 top_k: Optional[int] = None, eta: float = 1.0, gamma: float = 1.0,
                 negative_slope: float = 0.01, chunk_elements: int = CHUNK_ELEMENTS):
        super().__init__()
        self.in_channels = check_int("in_channels", in_channels)
        if order is not None and not isinstance(order, UnitOrder):
            raise TypeError(f"order must be a UnitOrder (SequenceOrder, RasterOrder) or None, "
                            f"got {type(order).__name__}")
        self.order = order
        self.top_k = TOP_K.check("top_k", top_k, typed=True)
        self.eta = LOSS_WEIGHT.check("eta", eta)
        self.gamma = LOSS_WEIGHT.check("gamma", gamma)
        self.negative_slope = LOSS_WEIGHT.check("negative_slope", negative_slope)
        self.chunk_elements = check_int("chunk_elements", chunk_elements)
        self.weight = torch.nn.Parameter(torch.empty(in_channels))
        self.reset_parameters()

    def reset_parameters(self):
        bound = self.in_channels ** -0.5
        torch.nn.init.uniform_(self.weight, -bound, bound)

    def forward(self, x: Tensor, batch: Optional[Tensor] = None) -> LearnedGraph:
        seqs = self._check_input(x, batch)
        padded = seqs.to_padded(x)
        # targets per chunk: each target row holds B x T x C differences
        steps = max(1, self.chunk_elements // max(1, padded.numel()))
        parts: List[Tuple[Tensor, ...]] = []
        recompute = torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)
        for j0 in range(0, seqs.max_len, steps):
            j1 = min(j0 + steps, seqs.max_len)
            if recompute:
                parts.append(checkpoint(self._chunk, padded, seqs.lengths, j0, j1,
                                        use_reentrant=False))
            else:
                parts.append(self._chunk(padded, seqs.lengths, j0, j1))
        return self._assemble(parts, seqs)

    def _check_input(self, x: Tensor, batch: Optional[Tensor]) -> SequenceBatch:
        """The door: features, batch, samples (one sync for the values)."""
        check_features(x, self.in_channels)
        check_dtype(x, self.weight.dtype)
        seqs = sequence_batch(x.size(0), batch, x.device)
        empty = [b for b, n in enumerate(seqs.sizes) if n == 0]
        if empty:
            raise ValueError(f"sample {empty[0]} has no units (batch skips its id): a graph "
                             f"is learned per sample, so every sample needs units")
        order = self.order
        if isinstance(order, RasterOrder) and any(n != order.num_units for n in seqs.sizes):
            raise ValueError(f"{order} needs samples of {order.num_units} units (height x "
                             f"width, raster order), got sizes {sorted(set(seqs.sizes))}")
        first_failure([(~torch.isfinite(x).all(), "x contains NaN or Inf")])
        return seqs

    def _allowed(self, j0: int, j1: int, lengths: Tensor, max_len: int) -> Tensor:
        """``[B, j1 - j0, T]`` allowed (target, source) pairs, false at padding."""
        if self.order is not None:
            return self.order.block_mask(j0, j1, 0, max_len, lengths)
        j = torch.arange(j0, j1, device=lengths.device).view(1, -1, 1)
        i = torch.arange(max_len, device=lengths.device).view(1, 1, -1)
        length = lengths.view(-1, 1, 1)
        return (j < length) & (i < length)

    def _chunk(self, padded: Tensor, lengths: Tensor, j0: int, j1: int) -> Tuple[Tensor, ...]:
        """Targets ``j0..j1-1``: kept ``(sample, target, source, weight)`` and each
        sample's two sums of :math:`L_{GL}` (``[B]``, ``[B]``)."""
        t = padded.size(1)
        diff = padded[:, j0:j1, None, :] - padded[:, None, :, :]   # [B, c, T, C]
        scores = F.leaky_relu(diff.abs() @ self.weight, self.negative_slope)
        allowed = self._allowed(j0, j1, lengths, t)
        # a finite floor, not -inf: a row with no allowed source stays finite (then zeroed)
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        dense = torch.softmax(scores, dim=-1) * allowed
        if self.top_k is None:
            b, tgt, src = allowed.nonzero(as_tuple=True)
            weight = dense[b, tgt, src]
        else:
            b, _, tgt, src, weight = prune_rows(dense.unsqueeze(1), self.top_k)
        distance = diff[b, tgt, src].pow(2).sum(-1)
        exp_sum = padded.new_zeros(padded.size(0)).index_add(
            0, b, torch.exp(weight + self.eta * distance))
        square_sum = padded.new_zeros(padded.size(0)).index_add(0, b, weight * weight)
        return b, tgt + j0, src, weight, exp_sum, square_sum

    def _assemble(self, parts: List[Tuple[Tensor, ...]], seqs: SequenceBatch) -> LearnedGraph:
        b, tgt, src, weight = (torch.cat([p[k] for p in parts]) for k in range(4))
        exp_sum = torch.stack([p[4] for p in parts]).sum(0)
        square_sum = torch.stack([p[5] for p in parts]).sum(0)
        n = seqs.lengths.to(exp_sum.dtype)
        loss = (exp_sum / (n * n) + self.gamma * square_sum).mean()
        target = seqs.ptr[b] + tgt
        target, order = target.sort(stable=True)   # chunks hold (sample, target, source)
        source = (seqs.ptr[b] + src)[order]
        return LearnedGraph(torch.stack([source, target]), weight[order], loss)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.in_channels}, order={self.order}, "
                f"top_k={self.top_k}, eta={self.eta:g}, gamma={self.gamma:g})")
