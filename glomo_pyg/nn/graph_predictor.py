"""The graph predictor g of GLoMo for sequences (paper Sec. 2.1)."""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from torch import Tensor

from glomo_pyg.nn.cnn import CausalCNN
from glomo_pyg.nn.emitter import ScoredEmitter
from glomo_pyg.nn.encoder import UnitEncoder
from glomo_pyg.nn.scorer import GraphScorer, resolve_head_channels
from glomo_pyg.sequences import SequenceBatch


class GraphPredictor(ScoredEmitter):
    r"""The GLoMo graph predictor :math:`g`: emits a stack of weighted graphs over the
    units of a batch of sequences.

    Units are embedded (token ids) or linearly projected (features), read by two
    causal CNNs (key and query), and scored into graphs by :class:`GraphScorer` (paper
    Eq. 1). Forward graphs connect each source to later targets (:math:`i < j`),
    backward graphs to earlier ones (:math:`i > j`), and the CNNs look the same way.

    Args:
        num_tokens (int, optional): vocabulary size, for token-id input.
        in_channels (int, optional): feature size, for ``[N, F]`` input.
        hidden_channels (int): CNN width :math:`d`. (default: :obj:`512`)
        num_layers (int): graph layers :math:`L`. (default: :obj:`3`)
        heads (int): graphs per layer. (default: :obj:`8`)
        head_channels (int, optional): key/query size per head. (default: ``C / H``)
        direction (str): ``'forward'`` or ``'backward'``.
        include_self (bool): admit :math:`i = j` edges. (default: :obj:`False`)
        sparse (bool): squared ReLU; ``False``: the softmax ablation. (default: :obj:`True`)
        cnn_layers (int): convolutions per CNN. (default: :obj:`4`)
        kernel_size (int): convolution width. (default: :obj:`3`)
        norm (str, optional): ``'layer'``, ``'batch'`` or ``None``. (default: :obj:`'layer'`)
        bias (str): ``'scalar'`` (paper) or ``'threshold'`` (reference code).
        padding_idx (int, optional): embedding padding index.
        dropout (float): dropout after each convolution. (default: :obj:`0.`)
        block_size (int): maximum dense scores held per head while emitting.
        position (str, optional): ``'relative'``: a learned distance term (an extension,
            see :class:`GraphScorer`). (default: :obj:`None`)
        position_frequencies (int), position_period (float): its Fourier terms.

    Shapes:
        - **input:** token ids :math:`(N)` or features :math:`(N, F_{in})`,
          batch vector :math:`(N)` (sorted; ``None`` for one sequence)
        - **output:** :class:`~glomo_pyg.LatentGraphs` with ``num_layers``
          layers of ``heads`` graphs over the :math:`N` units
    """

    def __init__(self, num_tokens: Optional[int] = None, in_channels: Optional[int] = None,
                 hidden_channels: int = 512, num_layers: int = 3, heads: int = 8,
                 head_channels: Optional[int] = None, direction: str = "forward",
                 include_self: bool = False, sparse: bool = True, cnn_layers: int = 4,
                 kernel_size: int = 3, norm: Optional[str] = "layer", bias: str = "scalar",
                 padding_idx: Optional[int] = None, dropout: float = 0.0,
                 block_size: int = 1 << 22,
                 position: Optional[str] = None, position_frequencies: int = 16,
                 position_period: float = 512.0):
        super().__init__()
        head_channels = resolve_head_channels(hidden_channels, heads, head_channels)
        self.hidden_channels, self.direction = hidden_channels, direction
        self.encoder = UnitEncoder(hidden_channels, num_tokens, in_channels, padding_idx)
        cnn: Dict[str, Any] = dict(num_layers=cnn_layers, kernel_size=kernel_size,
                                   direction=direction, norm=norm, dropout=dropout)
        self.key_cnn = CausalCNN(hidden_channels, **cnn)
        self.query_cnn = CausalCNN(hidden_channels, **cnn)
        self.scorer = GraphScorer(hidden_channels, num_layers, heads, head_channels, bias, sparse,
                                  direction, include_self, block_size, position,
                                  position_frequencies, position_period)

    def states(self, x: Tensor, sequences: SequenceBatch) -> Tuple[Tensor, Tensor]:
        h = sequences.to_padded(self.encoder.encode(x))
        mask = sequences.mask
        return self.key_cnn(h, mask), self.query_cnn(h, mask)

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}({self.encoder!r}, hidden_channels="
                f"{self.hidden_channels}, num_layers={self.num_layers}, heads={self.heads}, "
                f"direction='{self.direction}', sparse={self.scorer.sparse})")
