r"""Fused graph propagation: paper Eq. 1 (squared-ReLU graphs) and Eq. 2 (aggregation) in
one FlexAttention call that never materialises the ``T x T`` graph.

With augmented keys :math:`k_i` and queries :math:`q_j` (bias and position terms folded
in), FlexAttention with ``score_mod(s) = 2 log s`` for :math:`s > 0` and :math:`-\infty`
otherwise computes

.. math::
    \frac{\sum_i \exp(2 \log s_{ij}) v_i}{\sum_i \exp(2 \log s_{ij})}
    = \sum_i \frac{\mathrm{ReLU}(s_{ij})^2}{\sum_{i'} \mathrm{ReLU}(s_{i'j})^2} v_i
    = \sum_i G_{ij} v_i

over the allowed sources of the block mask; a target without a positive allowed score
gets exactly 0. ``normalization='softmax'`` is plain FlexAttention. See docs/design.md,
"The fused layout" (dynamic shapes, CPU fallback, bfloat16 precision).
"""
from __future__ import annotations

import importlib
import types
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from glomo_pyg.kernels import NORMALIZATIONS, autocast_half_dtype
from glomo_pyg.ordering import DIRECTIONS

BLOCK = 128  # FlexAttention's default block size, and the padding granularity
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Smallest head dim per device (CUDA's ``tl.dot`` needs 16): narrower ones are zero-padded.
MIN_HEAD_DIM: Dict[str, int] = {"cuda": 16}
# Widest value block per kernel call (Triton's shared memory runs out at about 300 columns
# on an H100): wider values are propagated in column blocks.
MAX_VALUE_DIM: Dict[str, int] = {"cuda": 64}
# Most int32 block indices per block-mask table (1 GiB); past it, use the sparse layout.
MAX_MASK_BLOCKS = 2 ** 28

_COMPILED: Dict[str, object] = {}


def available() -> bool:
    """Whether this torch has FlexAttention."""
    try:
        importlib.import_module("torch.nn.attention.flex_attention")
    except ImportError:
        return False
    return True


def _flex(dtype: torch.dtype = torch.float32):
    """Compiled FlexAttention for ``dtype``."""
    # one code object per dtype: torch caps compiled variants per code object at 8
    name = "flex" if dtype == torch.float32 else f"flex_{str(dtype).split('.')[-1]}"
    if name not in _COMPILED:
        from torch.nn.attention.flex_attention import flex_attention
        entry = flex_attention
        if name != "flex":  # float32 compiles flex_attention itself

            def call(*args, **kwargs):
                return flex_attention(*args, **kwargs)

            entry = types.FunctionType(call.__code__.replace(co_name=name), call.__globals__,
                                       name, None, call.__closure__)
        _COMPILED[name] = torch.compile(entry, dynamic=True)
    return _COMPILED[name]


def _relu2_score(score, b, h, q_idx, kv_idx):
    # log of a placeholder 1 where s <= 0: the gradient of the unselected branch is then
    # 0 * 1 instead of 0 * (1 / s), which is NaN at s = 0 (zeroed padding keys, s = 0 scores)
    positive = score > 0
    return torch.where(positive, 2.0 * torch.log(torch.where(positive, score, 1.0)),
                       -float("inf"))


def _block_structure(lengths: Tensor, t: int, direction: str, include_self: bool,
                     window: Optional[int] = None, grid_width: Optional[int] = None
                     ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(kv_num_blocks, kv_indices, full_num_blocks, full_indices)`` of the order's mask."""
    nb = -(-t // BLOCK)
    start = torch.arange(nb, device=lengths.device) * BLOCK
    end = start + BLOCK  # exclusive
    length = lengths.view(-1, 1, 1)
    q0, q1 = start.view(1, -1, 1), end.view(1, -1, 1)  # query (target) blocks
    k0, k1 = start.view(1, 1, -1), end.view(1, 1, -1)  # key (source) blocks
    q_last = torch.minimum(q1, length) - 1  # last real target of the block
    k_last = torch.minimum(k1, length) - 1
    real = (q0 < length) & (k0 < length)
    if direction == "forward":  # sources i < j (<= with include_self)
        some = (k0 <= q_last) if include_self else (k0 < q_last)
        every = (k1 - 1 <= q0) if include_self else (k1 - 1 < q0)
    else:  # sources i > j (>= with include_self)
        some = (k_last >= q0) if include_self else (k_last > q0)
        every = (k0 >= q1 - 1) if include_self else (k0 > q1 - 1)
    if window is not None:
        unit = 1 if grid_width is None else grid_width  # distances in units, or in rows
        qa, qb = q0 // unit, (q1 - 1) // unit
        ka, kb = k0 // unit, (k1 - 1) // unit
        nearest = torch.maximum(ka - qb, qa - kb).clamp(min=0)
        farthest = torch.maximum(qb - ka, kb - qa)
        some = some & (nearest <= window)
        every = every & (farthest <= window)
        if grid_width is not None and grid_width - 1 > window:  # columns may be cut too
            every = torch.zeros_like(every)
    full = real & every & (q1 <= length) & (k1 <= length)
    partial = real & some & ~full

    def indices(m: Tensor) -> Tuple[Tensor, Tensor]:
        # allowed key blocks first (stable), as FlexAttention reads the first `num` indices
        order = torch.argsort((~m).to(torch.int8), dim=-1, stable=True)
        return m.sum(-1).to(torch.int32).unsqueeze(1), order.to(torch.int32).unsqueeze(1)

    return (*indices(partial), *indices(full))


def block_mask(lengths: Tensor, t: int, direction: str, include_self: bool,
               order_only: bool = False, window: Optional[int] = None,
               grid_width: Optional[int] = None):
    """FlexAttention ``BlockMask`` of the allowed (target, source) pairs of sequences of
    ``lengths`` padded to ``t`` units (a multiple of :data:`BLOCK`).

    ``order_only``: the element mask tests the order, not the lengths (two loads less per
    score); exact for squared-ReLU graphs with zeroed padded keys (score 0 is dropped).
    ``window``: only pairs at most this far apart, ``|i - j|``, or with ``grid_width``
    (raster order) the larger of the row and column offsets."""
    from torch.nn.attention.flex_attention import BlockMask

    def allowed(q_idx, kv_idx):
        if direction == "forward":
            return (kv_idx <= q_idx) if include_self else (kv_idx < q_idx)
        return (kv_idx >= q_idx) if include_self else (kv_idx > q_idx)

    # a captured tensor: a Python int made Inductor's CPU code fail for a second mask
    reach = None if window is None else torch.tensor(window, device=lengths.device)

    def near(q_idx, kv_idx):
        if grid_width is None:
            return (q_idx - kv_idx).abs() <= reach
        rows = (q_idx // grid_width - kv_idx // grid_width).abs()
        return (rows <= reach) & ((q_idx % grid_width - kv_idx % grid_width).abs() <= reach)

    if order_only and window is None:
        def mask_mod(b, h, q_idx, kv_idx):
            return allowed(q_idx, kv_idx)
    elif order_only:
        def mask_mod(b, h, q_idx, kv_idx):
            return allowed(q_idx, kv_idx) & near(q_idx, kv_idx)
    elif window is None:
        def mask_mod(b, h, q_idx, kv_idx):
            return allowed(q_idx, kv_idx) & (q_idx < lengths[b]) & (kv_idx < lengths[b])
    else:
        def mask_mod(b, h, q_idx, kv_idx):
            return (allowed(q_idx, kv_idx) & near(q_idx, kv_idx) & (q_idx < lengths[b])
                    & (kv_idx < lengths[b]))
    num, idx, full_num, full_idx = _block_structure(lengths, t, direction, include_self,
                                                    window, grid_width)
    return BlockMask.from_kv_blocks(num, idx, full_num, full_idx, BLOCK_SIZE=BLOCK,
                                    mask_mod=mask_mod, seq_lengths=(t, t))


def check_fusable(key: Tensor, query: Tensor) -> None:
    """``ValueError`` naming the other layouts for inputs FlexAttention cannot take (no
    FlexAttention, dtype, shapes, a block mask over :data:`MAX_MASK_BLOCKS`). No sync."""
    shaped = key.dtype in DTYPES and query.dtype == key.dtype and key.dim() == 4 and \
        key.shape == query.shape
    b, t = (key.size(0), key.size(2)) if shaped else (0, 0)
    blocks = -(-t // BLOCK)
    problem = (
        "the fused layout needs torch.nn.attention.flex_attention (torch >= 2.5); use "
        "layout='sparse' or 'dense'" if not available() else
        f"the fused layout supports {[str(d) for d in DTYPES]} keys and queries of one shape "
        f"[B, H, T, D], got {key.dtype} {tuple(key.shape)} and {query.dtype} "
        f"{tuple(query.shape)}; use layout='sparse' or 'dense'" if not shaped else
        f"sequences of {t} units in a batch of {b} are too long for the fused layout's block "
        f"mask ({b} x {blocks}^2 blocks > {MAX_MASK_BLOCKS}); use layout='sparse' (memory "
        f"O(edges)) or split the batch" if b * blocks * blocks > MAX_MASK_BLOCKS else None)
    if problem:
        raise ValueError(problem)


def resolve_kernel_dtype(key: Tensor, kernel_dtype: Optional[torch.dtype] = None
                         ) -> torch.dtype:
    """The dtype keys, queries and values enter FlexAttention in: ``kernel_dtype`` when
    given, else bfloat16 in a bfloat16 autocast region
    (:func:`glomo_pyg.kernels.autocast_half_dtype`), else the keys' dtype."""
    if kernel_dtype is not None:
        if kernel_dtype not in DTYPES:
            raise ValueError(f"kernel_dtype must be one of {[str(d) for d in DTYPES]} or "
                             f"None, got {kernel_dtype}")
        return kernel_dtype
    return autocast_half_dtype(key.device.type) or key.dtype


def fused_propagate(key: Tensor, query: Tensor, values: Tensor, lengths: Tensor, *,
                    direction: str = "forward", include_self: bool = False,
                    normalization: str = "relu2", mask=None,
                    full_length: Optional[bool] = None, check: bool = True,
                    kernel_dtype: Optional[torch.dtype] = None) -> Tensor:
    r""":math:`\sum_i G_{ij} v_i` for every head and target, with the graphs of paper
    Eq. 1 given by their augmented keys and queries.

    Args:
        key, query: ``[B, H, T, D]`` padded per-head keys and queries (scores are their
            inner products).
        values: ``[B, H, T, C]`` per-head or ``[B, 1, T, C]`` shared values.
        lengths: ``[B]`` valid lengths.
        mask: a :func:`block_mask` of these lengths, padded length and order (built when
            ``None``).
        full_length: every sequence has length ``T`` (``None``: computed, a device sync).
        check: validate ``key`` and ``query`` (:func:`check_fusable`).
        kernel_dtype: see :func:`resolve_kernel_dtype`.

    Returns ``[B, H, T, C]`` in the dtype of ``values``, zero at padding and at targets
    without edges; differentiable where FlexAttention has a backward (not on CPU).
    """
    if check:
        check_fusable(key, query)
    b, h, t, _ = key.shape
    dtype = resolve_kernel_dtype(key, kernel_dtype)
    _check_propagation(direction, normalization, values, b, h, t)
    padded = -(-t // BLOCK) * BLOCK
    pad = padded - t
    if values.size(1) == 1 and h > 1:  # shared input: every head reads the same values
        values = values.expand(b, h, t, values.size(-1))
    out_dtype = values.dtype
    # autocast is off inside (it would recast each operand): cast here, once
    key, query, values = key.to(dtype), query.to(dtype), values.to(dtype)
    width = values.size(-1)
    min_dim = MIN_HEAD_DIM.get(key.device.type, 1)
    dim_pad = max(0, min_dim - key.size(-1))
    key, query, values = _padded_operands(key, query, values, pad, dim_pad)
    relu2 = normalization == "relu2"
    if full_length is None:
        full_length = bool((lengths == t).all())
    zero_padding = relu2 and not (full_length and not pad)
    if zero_padding:  # zero keys at padding: score 0, dropped by the squared ReLU (block_mask)
        real = torch.arange(padded, device=key.device).view(1, 1, -1, 1) < \
            lengths.view(-1, 1, 1, 1)
        key = key * real.to(key.dtype)
    if mask is None:
        mask = block_mask(lengths, padded, direction, include_self, order_only=relu2)
    out = _flex_parts(query.contiguous(), key.contiguous(), values, mask, dtype, relu2,
                      min_dim, MAX_VALUE_DIM.get(key.device.type, width))[:, :, :t]
    if zero_padding:  # padded targets read real keys under the order-only mask: zero them
        out = out * real[:, :, :t].to(out.dtype)
    return out.to(out_dtype)


def _check_propagation(direction: str, normalization: str, values: Tensor, b: int, h: int,
                       t: int) -> None:
    """``ValueError`` unless the direction, the normalization and the values' shape are valid."""
    if direction not in DIRECTIONS or normalization not in NORMALIZATIONS or \
            values.dim() != 4 or values.shape[0] != b or values.shape[2] != t or \
            values.shape[1] not in (1, h):
        raise ValueError(f"direction must be one of {DIRECTIONS}, normalization one of "
                         f"{NORMALIZATIONS} and values must be [B, H or 1, T, C] = [{b}, {h} "
                         f"or 1, {t}, C]; got {direction!r}, {normalization!r}, "
                         f"{tuple(values.shape)}")


def _padded_operands(key: Tensor, query: Tensor, values: Tensor, pad: int, dim_pad: int
                     ) -> Tuple[Tensor, Tensor, Tensor]:
    """``(key, query, values)`` zero-padded by ``pad`` units, keys and queries by ``dim_pad``."""
    if pad or dim_pad:  # zero units past T and zero key/query dims: scores unchanged
        key, query = (torch.nn.functional.pad(a, (0, dim_pad, 0, pad)) for a in (key, query))
    if pad:
        values = torch.nn.functional.pad(values, (0, 0, 0, pad))
    return key, query, values


def _flex_parts(query: Tensor, key: Tensor, values: Tensor, mask, dtype: torch.dtype,
                relu2: bool, min_dim: int, block: int) -> Tensor:
    """FlexAttention over ``values`` in parts of at most ``block`` channels."""
    try:
        with torch.autocast(key.device.type, enabled=False):
            outs = []
            for part in values.split(block, -1):
                part_width = part.size(-1)
                if part_width < min_dim:
                    part = torch.nn.functional.pad(part, (0, min_dim - part_width))
                outs.append(_flex(dtype)(query, key, part.contiguous(),
                                    score_mod=_relu2_score if relu2 else None,
                                    block_mask=mask, scale=1.0)[..., :part_width])
            return outs[0] if len(outs) == 1 else torch.cat(outs, -1)
    except torch.OutOfMemoryError:
        raise
    except (NotImplementedError, RuntimeError) as e:  # the kernel refused these shapes
        raise ValueError(
            f"FlexAttention cannot run keys/queries {tuple(key.shape)} with values "
            f"{tuple(values.shape)} on {key.device.type} ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}); use layout='sparse' or "
            f"'dense'") from e


def needs_fallback(*tensors: Optional[Tensor]) -> bool:
    """FlexAttention has no backward on CPU: true when a gradient would be needed there."""
    if not torch.is_grad_enabled():
        return False
    live = [x for x in tensors if x is not None]
    return any(x.requires_grad for x in live) and any(x.device.type == "cpu" for x in live)
