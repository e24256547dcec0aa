"""The context decoder of the pretraining objective (paper Eq. 3)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

IGNORE = -100  # target id of positions past the end of a sequence


class ContextDecoder(torch.nn.Module):
    r"""Predicts the next :math:`D` units after a position from its feature.

    A GRU whose layers all start from the position's top-layer feature :math:`f^L_t`
    reads :math:`[0, \mathrm{emb}(x_{t+1}), \dots, \mathrm{emb}(x_{t+D-1})]` and
    predicts :math:`x_{t+1}, \dots, x_{t+D}`, maximising
    :math:`\log P(x_{t+1..t+D} \mid f^L_t)`, with its output layer tied to the input
    embedding (backward: the targets are :math:`x_{t-1}, \dots, x_{t-D}`).

    Args:
        embedding (torch.nn.Embedding): the feature predictor's input embedding.
        hidden_channels (int): width of :math:`f^L_t` and of the GRU.
        context_length (int): :math:`D`. (default: :obj:`3`)
        num_layers (int): GRU layers. (default: :obj:`2`)
        dropout (float): dropout between GRU layers. (default: :obj:`0.`)

    Shapes:
        - **input:** states :math:`(P, C)`, targets :math:`(P, D)` ids
          (``-100`` where the context runs past the sequence)
        - **output:** logits :math:`(P, D, V)`
    """

    def __init__(self, embedding: torch.nn.Embedding, hidden_channels: int, context_length: int = 3,
                 num_layers: int = 2, dropout: float = 0.0):
        super().__init__()
        if context_length < 1 or isinstance(num_layers, bool) or \
                not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"context_length must be >= 1 and the decoder needs at least one "
                             f"GRU layer: num_layers (Glomo's decoder_layers) must be a positive "
                             f"integer, got {context_length!r} and {num_layers!r}")
        self.embedding, self.context_length = embedding, context_length
        dim = embedding.embedding_dim
        self.rnn = torch.nn.GRU(dim, hidden_channels, num_layers, batch_first=True,
                                dropout=dropout if num_layers > 1 else 0.0)
        self.proj = torch.nn.Linear(hidden_channels, dim) if hidden_channels != dim else None
        self.out_bias = torch.nn.Parameter(torch.zeros(embedding.num_embeddings))

    def reset_parameters(self):
        self.rnn.reset_parameters()
        if self.proj is not None:
            self.proj.reset_parameters()
        torch.nn.init.zeros_(self.out_bias)

    def forward(self, state: Tensor, targets: Tensor) -> Tensor:
        # padded targets only feed ignored steps
        inputs = self.embedding(targets[:, :-1].clamp_min(0))
        inputs = torch.cat([inputs.new_zeros(inputs.size(0), 1, inputs.size(2)), inputs], 1)
        h0 = state.unsqueeze(0).expand(self.rnn.num_layers, -1, -1).contiguous()
        out, _ = self.rnn(inputs, h0)
        if self.proj is not None:
            out = self.proj(out)
        return F.linear(out, self.embedding.weight, self.out_bias)

    def targets(self, x: Tensor, sequences, positions: Tensor, direction: str) -> Tensor:
        """``[P, D]`` ids of the next (forward) or previous (backward) :math:`D` units
        after each flat unit id in ``positions`` (``-100`` past the sequence)."""
        step = 1 if direction == "forward" else -1
        offsets = step * torch.arange(1, self.context_length + 1, device=x.device)
        local = sequences.position[positions].view(-1, 1) + offsets
        length = sequences.lengths[sequences.batch[positions]].view(-1, 1)
        valid = (local >= 0) & (local < length)
        flat = (positions.view(-1, 1) + offsets).clamp(0, x.numel() - 1)
        return torch.where(valid, x[flat], torch.full_like(flat, IGNORE))

    def loss(self, state: Tensor, targets: Tensor):
        """Mean cross-entropy over real targets, and the number of correct argmax predictions."""
        logits = self(state, targets)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE)
        correct = ((logits.argmax(-1) == targets) & (targets != IGNORE)).sum()
        return loss, correct

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(context_length={self.context_length}, "
                f"rnn_layers={self.rnn.num_layers}, vocab={self.embedding.num_embeddings})")
