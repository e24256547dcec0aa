"""The viewer's data (the graphs of one sentence or one image, pruned as asked) and its
page. See :func:`view`."""
from __future__ import annotations

import html
import json
import os
from dataclasses import dataclass
from importlib import resources
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np
import torch
from torch import Tensor

from glomo_pyg.analysis.export import MAX_IMAGE_PIXELS, directions, image_predictor, windowed
from glomo_pyg.analysis.viewer.inputs import valid_text
from glomo_pyg.graph_conversion import check_sample
from glomo_pyg.graph_names import relation_name
from glomo_pyg.graphs.pruning import check_pruning, prune_rows
from glomo_pyg.io.image_files import pil_pixels, read_image_file
from glomo_pyg.io.paths import check_output_file

# pages stay small: edges of at least MIN_WEIGHT, and on images each target's
# IMAGE_TOP_K heaviest sources only (a 32x32 image with 24 graphs: under 3 MB)
MIN_WEIGHT = 0.01
IMAGE_TOP_K = 8
MAX_PAGE_BYTES = 8 << 20  # refused beyond this: raise min_weight or lower top_k
MAX_TEXT_TOKENS = 512
# what an image larger than MAX_IMAGE_PIXELS is told (a file's, read from its header)
TOO_LARGE = (f"the viewer shows images of at most {MAX_IMAGE_PIXELS} pixels (e.g. 64x64), "
             "each read at its own size: view a smaller image or a crop")


def prune(dense: Tensor, min_weight: float, top_k: Optional[int]) -> Dict[str, List]:
    """One ``[T, T]`` graph (``[i, j] = G_ij``, source ``i``, target ``j``) as the page
    holds it: per target ``j`` (CSR over targets, ``ptr``), the sources that
    :func:`~glomo_pyg.graphs.pruning.prune_rows` keeps (the rule of the transforms and
    ``glomo export``), heaviest first; weights rounded to 5 decimals."""
    _, _, tgt, src, weight = prune_rows(dense.t().double()[None, None], top_k, min_weight)
    order = torch.sort(weight, descending=True, stable=True).indices
    order = order[torch.sort(tgt[order], stable=True).indices]  # by target, heaviest first
    counts = torch.bincount(tgt, minlength=dense.size(0))
    ptr = [0] + torch.cumsum(counts, 0).tolist()
    return dict(ptr=ptr, src=src[order].tolist(),
                w=[round(w, 5) for w in weight[order].tolist()])


def _graph_lists(graphs, min_weight, top_k, products: bool, sample: int = 0) -> Dict[str, Any]:
    """Every layer and head of ``sample``'s graphs (with ``products``: G^1...G^l too), and
    their names (:func:`~glomo_pyg.graph_names.relation_name`), which the page shows."""
    n = int(graphs.lengths[sample])
    dense = graphs.to_dense()[:, sample, :, :n, :n].detach().cpu()  # [L, H, T, T]
    names = lambda chained: [[relation_name(graphs.direction, l, h, chained)  # noqa: E731
                              for h in range(dense.size(1))] for l in range(dense.size(0))]
    out = dict(layers=dense.size(0), heads=dense.size(1), names=names(False),
               graphs=[[prune(g, min_weight, top_k) for g in layer] for layer in dense])
    if products:
        chained = [dense[0].double()]  # [H, T, T] per layer: (G^1 ... G^l)_ij
        for layer in dense[1:]:
            chained.append(chained[-1] @ layer.double())
        out["products"] = [[prune(g, min_weight, top_k) for g in layer] for layer in chained]
        out["product_names"] = names(True)
    return out


def _image_pixels(image) -> Tensor:
    """``image`` (a tensor, array, PIL image or file) as uint8 ``[3, H, W]``."""
    if isinstance(image, (str, os.PathLike)):
        image = read_image_file(image, MAX_IMAGE_PIXELS, TOO_LARGE)
    if hasattr(image, "convert") and not isinstance(image, (Tensor, np.ndarray)):
        image = pil_pixels(image, "image")
    if isinstance(image, np.ndarray):
        image = torch.from_numpy(np.array(image, copy=True, order="C"))  # (a writable copy)
    if isinstance(image, Tensor) and image.dim() == 3 and image.shape[0] != 3 and \
            image.shape[-1] == 3:
        image = image.permute(2, 0, 1)
    if not isinstance(image, Tensor) or image.dim() != 3 or image.shape[0] != 3 or \
            image.dtype != torch.uint8:
        raise ValueError(f"image must be uint8 with 3 colour planes, [3, H, W] or [H, W, 3] (a "
                         f"tensor, numpy array, PIL image or a file), got "
                         f"{getattr(image, 'dtype', type(image).__name__)} "
                         f"{tuple(getattr(image, 'shape', ()))}")
    return image.contiguous()


def _units(text, image, lower: bool):
    """``(data, pixels)``: the page's tokens (``pixels`` None) or image."""
    from glomo_pyg.data.text import tokenize

    if isinstance(text, str):
        return dict(kind="text", tokens=tokenize(valid_text(text, "text"), lower)), None
    if text is not None:
        return dict(kind="text", tokens=[valid_text(str(t), f"token {i} of text")
                                         for i, t in enumerate(text)]), None
    pixels = _image_pixels(image)
    return dict(kind="image", height=int(pixels.shape[1]), width=int(pixels.shape[2]),
                pixels=pixels.permute(1, 2, 0).flatten().tolist()), pixels


@torch.no_grad()
def _predicted_graphs(predictor, data: Dict[str, Any], pixels: Optional[Tensor]):
    """The graphs of a pretrained predictor on the sentence or image."""
    from glomo_pyg.nn.pretrained import PretrainedGraphPredictor

    if not isinstance(predictor, PretrainedGraphPredictor):
        raise TypeError(f"predictor must be a PretrainedGraphPredictor (e.g. from_pretrained) "
                        f"or the graphs themselves, got {type(predictor).__name__}")
    pixel = predictor.modality == "pixels"
    if pixel != (pixels is not None):
        raise ValueError("this is a pixel predictor: give image=, not text" if pixel else
                         "this predictor reads text: give text=, not image")
    if not pixel:
        from glomo_pyg.data.text import UNK

        tokens = data["tokens"]
        if not 2 <= len(tokens) <= MAX_TEXT_TOKENS:
            raise ValueError(f"a graph needs at least 2 tokens, and the viewer shows at most "
                             f"{MAX_TEXT_TOKENS} (a page of their graphs would not be "
                             f"readable: view a shorter passage), got {len(tokens)}")
        unknown = UNK if predictor.vocabulary is not None and UNK in predictor.vocabulary \
            else None
        ids = predictor.encode(tokens, unknown=unknown)
        return predictor(ids, torch.zeros(len(tokens), dtype=torch.long))
    from glomo_pyg.pixels import image_units

    assert pixels is not None  # (pixel)
    height, width = (int(v) for v in pixels.shape[1:])
    if height * width > MAX_IMAGE_PIXELS:
        raise ValueError(f"the image is {width}x{height} pixels ({height * width}); "
                         + TOO_LARGE)
    return image_predictor(predictor, height, width)(*image_units(pixels[None]))


def view_data(predictor, text: Union[str, Sequence[str], None] = None, *, image=None,
              gold=None, min_weight: Optional[float] = MIN_WEIGHT, top_k: Optional[int] = None,
              lower: bool = True, sample: int = 0,
              max_distance: Optional[int] = None) -> Dict[str, Any]:
    """The data a :class:`GraphView` page embeds (JSON-able): the tokens or the image,
    and each direction's layers and heads (text: and chained products), cut to
    ``max_distance`` and pruned by ``min_weight`` and ``top_k``; see :func:`view`."""
    from glomo_pyg.graphs import DirectionalGraphs, LatentGraphs, check_max_distance

    check_pruning(top_k, min_weight)
    check_max_distance(max_distance, optional=True)
    if (text is None) == (image is None):
        raise ValueError("give exactly one of text (a sentence or its tokens) and image")
    data, pixels = _units(text, image, lower)
    if isinstance(predictor, (LatentGraphs, DirectionalGraphs)):
        graphs = {d: g if max_distance is None else g.within(max_distance)
                  for d, g in directions(predictor)}
        n, text = check_sample(next(iter(graphs.values())), sample), data["kind"] == "text"
        units = len(data["tokens"]) if text else data["height"] * data["width"]
        if units != n:
            given = f"{units} tokens given" if text else f"the image has {units} pixels"
            raise ValueError(f"{given}, but sequence {sample} of the graphs has {n} units: give "
                             "that sequence's own tokens (or image)")
    else:
        emitted, _ = windowed(predictor, _predicted_graphs(predictor, data, pixels),
                              max_distance, "view")
        graphs, sample = dict(directions(emitted)), 0
    if data["kind"] == "image":
        top_k = IMAGE_TOP_K if top_k is None else top_k
    data.update(min_weight=float(min_weight or 0.0), top_k=top_k)
    if gold is not None and data["kind"] == "text":
        data["gold"] = _gold_heads(gold, data["tokens"])
    data["directions"] = {d: _graph_lists(g, min_weight, top_k, data["kind"] == "text", sample)
                          for d, g in graphs.items()}
    return data


def _gold_heads(gold, tokens: Sequence[str]) -> List[int]:
    """0-based gold heads (-1: root) of a ``GoldTree`` of the same words, or 1-based heads."""
    heads = getattr(gold, "heads", gold)
    words = getattr(gold, "words", None)
    listed = isinstance(heads, (list, tuple))
    if not listed or len(heads) != len(tokens) or \
            (words is not None and [w.lower() for w in words] != [t.lower() for t in tokens]) \
            or not all(isinstance(h, int) and 0 <= h <= len(tokens) for h in heads):
        raise ValueError(f"the gold tree has {len(heads) if listed else '?'} words, the sentence "
                         f"{len(tokens)} tokens: the gold tree must hold the sentence's own "
                         "words (view the treebank sentence's own words, text=tree.words) and "
                         "1-based heads (0 for the root)")
    return [h - 1 for h in heads]


def _asset(name: str) -> str:
    return resources.files("glomo_pyg.analysis.viewer").joinpath(name).read_text("utf-8")


def render(data: Dict[str, Any], title: str = "GLoMo graphs") -> str:
    """The self-contained HTML5 page of ``data``."""
    payload = json.dumps(data, separators=(",", ":"), allow_nan=False)
    # no "<" inside the script element, so no token can end or change it ("</script>",
    # "<!--"); JSON reads \u003c back as "<"
    payload = payload.replace("<", "\\u003c")
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n<style>\n{_asset('viewer.css')}</style>\n"
            "</head>\n<body>\n<div id=\"glomo-viewer\"></div>\n"
            f"<script type=\"application/json\" id=\"glomo-data\">{payload}</script>\n"
            f"<script>\n{_asset('viewer.js')}</script>\n</body>\n</html>\n")


@dataclass
class GraphView:
    """A viewer page: ``data`` (what :func:`view_data` returns) and its :attr:`html`,
    inline in notebooks (a sandboxed ``iframe``); :meth:`save` writes it."""

    data: Dict[str, Any]
    title: str = "GLoMo graphs"

    def __post_init__(self):
        valid_text(self.title, "title")

    @property
    def html(self) -> str:
        return render(self.data, self.title)

    def _repr_html_(self) -> str:
        height = 720 if self.data.get("kind") == "image" else 640
        return (f"<iframe srcdoc=\"{html.escape(self.html, quote=True)}\" "
                f"style=\"width: 100%; height: {height}px; border: 0\" "
                "sandbox=\"allow-scripts\"></iframe>")

    def save(self, path: Union[str, os.PathLike]) -> str:
        """Write the page, one self-contained file, to ``path`` (atomically); returns it."""
        from glomo_pyg.atomic_files import atomic_write

        path = check_output_file(path, "path", example="graphs.html")
        text = self.html
        if len(text.encode()) > MAX_PAGE_BYTES:
            raise ValueError(f"the page would take {len(text.encode()) >> 20} MB: raise "
                             "min_weight or lower top_k")
        with atomic_write(path) as fh:
            fh.write(text)
        return path


def view(predictor, text: Union[str, Sequence[str], None] = None, *, image=None, gold=None,
         min_weight: Optional[float] = MIN_WEIGHT, top_k: Optional[int] = None, lower: bool = True,
         title: Optional[str] = None, sample: int = 0,
         max_distance: Optional[int] = None) -> GraphView:
    r"""Every graph a pretrained predictor emits for one sentence or one image as an
    interactive, self-contained page (docs/analysis.md; paper Fig. 3 and 4).

    Args:
        predictor: a :class:`~glomo_pyg.PretrainedGraphPredictor`, or graphs already
            emitted (:class:`~glomo_pyg.LatentGraphs` or
            :class:`~glomo_pyg.DirectionalGraphs`) of which ``sample`` is shown.
        text: a sentence (tokenised as the predictor's corpus was) or its tokens.
        image: uint8 ``[3, H, W]`` or ``[H, W, 3]``, a PIL image or an image file (more
            than 8 bits: scaled, :func:`~glomo_pyg.io.image_files.to_uint8`) of at most
            :data:`~glomo_pyg.analysis.export.MAX_IMAGE_PIXELS` pixels, read at its own
            size as ``glomo export`` reads it
            (:func:`~glomo_pyg.analysis.export.image_predictor`).
        gold: a :class:`~glomo_pyg.analysis.treebank.GoldTree` of the same words, or their
            1-based CoNLL heads: gold arcs drawn beside the learned ones.
        min_weight, top_k: edges lighter than ``min_weight`` are left out, and with
            ``top_k`` all but each target's ``top_k`` heaviest (images: 8 by default).
        max_distance: edges longer than this are cut first
            (:meth:`~glomo_pyg.LatentGraphs.within`). Without it, a sentence longer (or
            an image larger) than the predictor's learned distance term saw gives a
            ``RuntimeWarning`` saying which window to pass.

    Strings (``text``, its tokens, ``title``) must be valid UTF-8. Returns a
    :class:`GraphView` (inline in a notebook; ``.save(path)``).
    """
    data = view_data(predictor, text, image=image, gold=gold, min_weight=min_weight,
                     top_k=top_k, lower=lower, sample=sample, max_distance=max_distance)
    if title is None:
        title = "GLoMo graphs: " + (" ".join(data["tokens"])[:60] if data["kind"] == "text"
                                    else f"{data['width']}x{data['height']} image")
    return GraphView(data, title)
