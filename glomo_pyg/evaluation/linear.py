"""A linear probe: multinomial logistic regression on frozen features, its L2 penalty
chosen on a validation split carved from the training set, then refit on all of it."""
from __future__ import annotations

from typing import Dict, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from glomo_pyg.settings import check_int

#: L2 penalties tried (on standardised features), strongest first: wide enough for a
#: few dozen pooled features as for thousands of them, a decade apart.
L2_GRID = (1.0, 1e-1, 1e-2, 1e-3, 1e-4)


def _check_data(x: Tensor, y: Tensor, name: str, features: Optional[int] = None) -> None:
    if not isinstance(x, Tensor) or x.dim() != 2 or not x.is_floating_point() or \
            (features is not None and x.size(1) != features):
        raise ValueError(f"{name} features must be a float [n, F] tensor"
                         + (f" with F = {features}" if features is not None else "")
                         + f", got {getattr(x, 'dtype', type(x).__name__)} "
                         f"{tuple(getattr(x, 'shape', ()))}")
    if not isinstance(y, Tensor) or y.dtype != torch.long or y.shape != (x.size(0),) or \
            (y.numel() and int(y.min()) < 0):
        got = f"{getattr(y, 'dtype', type(y).__name__)} {tuple(getattr(y, 'shape', ()))}"
        raise ValueError(f"{name} labels must be int64 [{x.size(0)}] class indices >= 0, got "
                         f"{got}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} features hold NaN or infinite values")


class LinearProbe:
    r"""Multinomial logistic regression on standardised frozen features,

    .. math::
        \min_{W, b}\; \frac{1}{n} \sum_i \mathrm{CE}\big(W \hat{x}_i + b, y_i\big)
        + \frac{\lambda}{2} \lVert W \rVert^2, \qquad
        \hat{x} = (x - \mu) / \sigma

    (:math:`\mu, \sigma` from the training features), solved by full-batch L-BFGS.
    :meth:`fit` tries each :math:`\lambda` of ``l2_grid`` on a seeded validation split
    of ``validation`` of the training samples (each from the previous one's weights),
    keeps the best (the strongest on ties), and refits on all the training samples from
    that solution.
    ``seed`` draws the split and the initial weights.

    Args:
        l2_grid (sequence of float): penalties tried. (default: :data:`L2_GRID`)
        validation (float): share of the training samples held out. (default: ``0.1``)
        max_iter (int): L-BFGS iterations per fit. (default: ``200``)
        seed (int): the split and initialisation. (default: ``0``)
    """

    def __init__(self, l2_grid: Sequence[float] = L2_GRID, validation: float = 0.1,
                 max_iter: int = 200, seed: int = 0):
        l2_grid = tuple(sorted((float(l) for l in l2_grid), reverse=True))
        if not l2_grid or any(not l >= 0 for l in l2_grid) or not 0 < validation < 1:
            raise ValueError(f"l2_grid must hold penalties >= 0 and validation lie in (0, 1), "
                             f"got {l2_grid}, {validation!r}")
        self.l2_grid, self.validation = l2_grid, float(validation)
        self.max_iter, self.seed = check_int("max_iter", max_iter), check_int("seed", seed, 0)
        self.l2: Optional[float] = None
        self.validation_accuracy: Dict[float, float] = {}

    def fit(self, x: Tensor, y: Tensor) -> "LinearProbe":
        """Choose :math:`\\lambda` on the validation split, then refit on all of ``x``."""
        _check_data(x, y, "training")
        n = x.size(0)
        held = max(1, round(n * self.validation))
        if n - held < 1 or int(y.max()) + 1 < 2:
            raise ValueError(f"a linear probe needs at least two training samples and two "
                             f"classes, got {n} samples of {int(y.max()) + 1} class(es)")
        self.num_classes, self.num_features = int(y.max()) + 1, x.size(1)
        generator = torch.Generator().manual_seed(self.seed)
        order = torch.randperm(n, generator=generator)
        train, val = order[held:], order[:held]
        init = torch.randn(self.num_classes, x.size(1), generator=generator) * 0.01
        weight, self.validation_accuracy, solutions = init, {}, {}
        z, y_train = self._standardised(x[train]), y[train]  # (x[train]: a copy)
        for l2 in self.l2_grid:
            weight, self.bias = self._solve(z, y_train, l2, weight)
            self.weight, solutions[l2] = weight, weight
            self.validation_accuracy[l2] = float((self.predict(x[val]) == y[val]).double().mean())
        del z
        self.l2 = max(self.l2_grid,  # (first: strongest)
                      key=self.validation_accuracy.__getitem__)
        self.weight, self.bias = self._solve(self._standardised(x), y, self.l2,
                                             solutions[self.l2])
        return self

    def _standardised(self, x: Tensor) -> Tensor:
        """``x`` standardised with its own statistics, which later inputs then share."""
        x = x.to(torch.float32, copy=True)  # (standardised in place: never the caller's)
        self.mean = x.mean(0, dtype=torch.float64).float()
        std = (x - self.mean).pow(2).mean(0, dtype=torch.float64).sqrt().float()
        # (constant features, e.g. the max of a never-positive channel, stay as they are)
        self.std = torch.where(std > 1e-6 * (1 + self.mean.abs()), std, torch.ones_like(std))
        return x.sub_(self.mean).div_(self.std)

    def _solve(self, z: Tensor, y: Tensor, l2: float, start: Tensor):
        weight = start.clone().requires_grad_(True)
        bias = torch.zeros(self.num_classes, requires_grad=True)
        optimizer = torch.optim.LBFGS([weight, bias], lr=1, max_iter=self.max_iter,
                                      history_size=20, tolerance_grad=1e-6,
                                      tolerance_change=1e-9, line_search_fn="strong_wolfe")

        def closure():
            optimizer.zero_grad()
            loss = F.cross_entropy(z @ weight.t() + bias, y) + 0.5 * l2 * weight.pow(2).sum()
            loss.backward()
            return loss

        optimizer.step(closure)
        return weight.detach(), bias.detach()

    def logits(self, x: Tensor) -> Tensor:
        if self.l2 is None and not hasattr(self, "weight"):
            raise RuntimeError("call fit before predicting")
        _check_data(x, torch.zeros(x.size(0), dtype=torch.long) if isinstance(x, Tensor)
                    and x.dim() == 2 else x, "input", self.num_features)
        return ((x.float() - self.mean) / self.std) @ self.weight.t() + self.bias

    def predict(self, x: Tensor) -> Tensor:
        return self.logits(x).argmax(1)

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(l2={self.l2}, grid={list(self.l2_grid)}, "
                f"validation={self.validation}, seed={self.seed})")
