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

from glomo_pyg.analysis.export import check_thinning
from glomo_pyg.analysis.viewer.inputs import (check_output_path, open_input_file, to_uint8,
                                              valid_text)
from glomo_pyg.graph_conversion import check_index

# Pages stay small: text graphs keep every edge of at least MIN_WEIGHT; pixel graphs
# also only each target's TOP_K heaviest sources (a 32x32 image with 24 graphs: under
# 3 MB at the defaults).
MIN_WEIGHT = 0.01
IMAGE_TOP_K = 8
MAX_PAGE_BYTES = 8 << 20  # refused beyond this: raise min_weight or lower top_k
MAX_TEXT_TOKENS = 512
MAX_IMAGE_PIXELS = 64 * 64


def prune(dense: Tensor, min_weight: float, top_k: Optional[int]) -> Dict[str, List]:
    """One ``[T, T]`` graph (``[i, j] = G_ij``, source ``i``, target ``j``) as the page
    holds it: per target ``j`` (CSR over targets, ``ptr``), its sources with weight at least
    ``min_weight``, the ``top_k`` heaviest if given (ties: the earlier source), heaviest
    first; weights rounded to 5 decimals."""
    t = dense.size(0)
    ptr, src, weight = [0], [], []
    columns = dense.t().double()  # [j, i]
    for j in range(t):
        col = columns[j]
        keep = (col >= min_weight) & (col > 0)
        idx = keep.nonzero().flatten()
        if idx.numel():
            vals = col[idx]
            order = sorted(range(idx.numel()), key=lambda k: (-float(vals[k]), int(idx[k])))
            if top_k is not None:
                order = order[:top_k]
            src += [int(idx[k]) for k in order]
            weight += [round(float(vals[k]), 5) for k in order]
        ptr.append(len(src))
    return dict(ptr=ptr, src=src, w=weight)


def _graph_lists(graphs, min_weight, top_k, products: bool, sample: int = 0) -> Dict[str, Any]:
    """Every layer and head of one direction's graphs of ``sample`` (and, with
    ``products``, the chained products G^1...G^l)."""
    n = int(graphs.lengths[sample])
    dense = graphs.to_dense()[:, sample, :, :n, :n].detach().cpu()  # [L, H, T, T]
    layers, heads = dense.shape[:2]
    out = dict(layers=layers, heads=heads,
               graphs=[[prune(dense[l, h], min_weight, top_k) for h in range(heads)]
                       for l in range(layers)])
    if products:
        chained = []
        for h in range(heads):
            acc = dense[0, h].double()
            per_layer = [acc]
            for l in range(1, layers):
                acc = acc @ dense[l, h].double()  # (G^1 ... G^l)_ij
                per_layer.append(acc)
            chained.append(per_layer)
        out["products"] = [[prune(chained[h][l], min_weight, top_k) for h in range(heads)]
                           for l in range(layers)]
    return out


def _pil_pixels(img, where: str) -> np.ndarray:
    """A PIL image as a uint8 ``[H, W, 3]`` array; greyscale of more than 8 bits (modes
    ``I;16``, ``I``) or float (``F``) scaled to 8 bits first, where ``convert`` would clip
    or truncate them (a 16-bit image all white, a float one all black)."""
    if img.mode == "F" or img.mode.startswith("I"):
        grey = to_uint8(np.asarray(img), where)
        return np.repeat(grey[:, :, None], 3, axis=2)
    return np.asarray(img.convert("RGB"), dtype=np.uint8)


def _read_image(path) -> np.ndarray:
    """The image file ``path`` as a uint8 ``[H, W, 3]`` array: a regular file only (a
    FIFO would hang the read), at most :data:`MAX_IMAGE_PIXELS` (from the header)."""
    from PIL import Image, UnidentifiedImageError

    name = os.fspath(path)
    try:
        with open_input_file(path, "image") as fh, Image.open(fh) as img:
            # the header's size first: nothing larger than a page shows is decoded
            if img.width * img.height > MAX_IMAGE_PIXELS:
                raise ValueError(f"{name} is {img.width}x{img.height} pixels; the viewer "
                                 f"shows images of at most {MAX_IMAGE_PIXELS} pixels")
            return _pil_pixels(img, f"image {name}")
    except (Image.DecompressionBombError, UnidentifiedImageError, OSError) as err:
        raise ValueError(f"cannot read image {name}: {err}") from None


def _image_pixels(image) -> Tensor:
    """``image`` as uint8 ``[3, H, W]``: a tensor (``[3, H, W]`` or ``[H, W, 3]``), a
    numpy array, a PIL image or an image file's path."""
    if isinstance(image, (str, os.PathLike)):
        image = _read_image(image)
    if hasattr(image, "convert") and not isinstance(image, (Tensor, np.ndarray)):
        image = _pil_pixels(image, "image")
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


def _tokens(text: Union[str, Sequence[str]], lower: bool) -> List[str]:
    """The tokens of ``text`` (a sentence or its tokens), each valid text: a lone
    surrogate could not be written to the page."""
    from glomo_pyg.data.text import tokenize

    if isinstance(text, str):
        return tokenize(valid_text(text, "text"), lower)
    return [valid_text(str(t), f"token {i} of text") for i, t in enumerate(text)]


def _given_graphs(graphs, text, image, sample: int, lower: bool):
    """Graphs given instead of a predictor: ``(DirectionalGraphs, data)`` after checking
    that the tokens (or the image) are the units of sequence ``sample``."""
    from glomo_pyg.graphs import DirectionalGraphs, LatentGraphs

    if isinstance(graphs, LatentGraphs):
        other = "backward" if graphs.direction == "forward" else "forward"
        graphs = DirectionalGraphs(**{graphs.direction: graphs, other: None})
    first = graphs.forward if graphs.forward is not None else graphs.backward
    check_index("sample", sample, first.num_sequences)
    n = int(first.lengths[sample])
    if text is not None:
        tokens = _tokens(text, lower)
        units, given = len(tokens), f"{len(tokens)} tokens given"
        data = dict(kind="text", tokens=tokens)
    else:
        pixels = _image_pixels(image)
        units = pixels.shape[1] * pixels.shape[2]
        given = f"the image has {units} pixels"
        data = _image_data(pixels)
    if units != n:
        raise ValueError(f"{given}, but sequence {sample} of the graphs has {n} units: give "
                         "that sequence's own tokens (or image)")
    return graphs, data


def _image_data(pixels: Tensor) -> Dict[str, Any]:
    return dict(kind="image", height=int(pixels.shape[1]), width=int(pixels.shape[2]),
                pixels=pixels.permute(1, 2, 0).flatten().tolist())


@torch.no_grad()
def _predicted_graphs(predictor, text, image, lower: bool):
    """``(DirectionalGraphs, data)`` of a pretrained predictor on the sentence or image."""
    from glomo_pyg.nn.pretrained import PretrainedGraphPredictor

    if not isinstance(predictor, PretrainedGraphPredictor):
        raise TypeError(f"predictor must be a PretrainedGraphPredictor (e.g. from_pretrained) "
                        f"or the graphs themselves, got {type(predictor).__name__}")
    emitter = predictor.predictor(predictor.directions[0])
    pixel = hasattr(emitter, "height")
    if pixel != (image is not None):
        raise ValueError("this is a pixel predictor: give image=, not text" if pixel else
                         "this predictor reads text: give text=, not image")
    if text is not None:
        from glomo_pyg.data.text import UNK

        tokens = _tokens(text, lower)
        if not 2 <= len(tokens) <= MAX_TEXT_TOKENS:
            raise ValueError(f"a graph needs at least 2 tokens, and the viewer shows at most "
                             f"{MAX_TEXT_TOKENS} (a page of their graphs would not be "
                             f"readable: view a shorter passage), got {len(tokens)}")
        unknown = UNK if predictor.vocabulary is not None and UNK in predictor.vocabulary \
            else None
        ids = predictor.encode(tokens, unknown=unknown)
        return predictor(ids, torch.zeros(len(tokens), dtype=torch.long)), \
            dict(kind="text", tokens=tokens)
    from glomo_pyg.pixels import image_units

    pixels = _image_pixels(image)
    if tuple(pixels.shape[1:]) != (emitter.height, emitter.width) or \
            pixels.shape[1] * pixels.shape[2] > MAX_IMAGE_PIXELS:
        raise ValueError(f"the image is {pixels.shape[2]}x{pixels.shape[1]} pixels; "
                         f"this predictor reads {emitter.width}x{emitter.height} and "
                         f"the viewer shows images of at most {MAX_IMAGE_PIXELS} pixels")
    return predictor(*image_units(pixels[None])), _image_data(pixels)


def view_data(predictor, text: Union[str, Sequence[str], None] = None, *, image=None,
              gold=None, min_weight: float = MIN_WEIGHT, top_k: Optional[int] = None,
              lower: bool = True, sample: int = 0) -> Dict[str, Any]:
    """The data a :class:`GraphView` page embeds (plain JSON-able lists): the tokens or
    the image, and for each direction every layer and head (and, for text, the chained
    products) pruned by ``min_weight`` and ``top_k``; see :func:`view`."""
    from glomo_pyg.graphs import DirectionalGraphs, LatentGraphs

    check_thinning(min_weight, top_k, closed=False)
    if (text is None) == (image is None):
        raise ValueError("give exactly one of text (a sentence or its tokens) and image")
    if isinstance(predictor, (LatentGraphs, DirectionalGraphs)):
        graphs, data = _given_graphs(predictor, text, image, sample, lower)
    else:
        (graphs, data), sample = _predicted_graphs(predictor, text, image, lower), 0
    if data["kind"] == "image":
        top_k = IMAGE_TOP_K if top_k is None else top_k
    data.update(min_weight=float(min_weight), top_k=top_k)
    if gold is not None and data["kind"] == "text":
        data["gold"] = _gold_heads(gold, data["tokens"])
    data["directions"] = {d: _graph_lists(getattr(graphs, d), min_weight, top_k,
                                          data["kind"] == "text", sample)
                          for d in ("forward", "backward") if getattr(graphs, d) is not None}
    return data


def _gold_heads(gold, tokens: Sequence[str]) -> List[int]:
    """0-based gold head of each token (-1: the root) from a ``GoldTree`` of the same
    words, or a list of 1-based CoNLL heads."""
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
    # no "<" at all inside the script element: neither "</script>" nor "<!--" can end or
    # change it, whatever the tokens hold (JSON reads \u003c back as "<")
    payload = payload.replace("<", "\\u003c")
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n<style>\n{_asset('viewer.css')}</style>\n"
            "</head>\n<body>\n<div id=\"glomo-viewer\"></div>\n"
            f"<script type=\"application/json\" id=\"glomo-data\">{payload}</script>\n"
            f"<script>\n{_asset('viewer.js')}</script>\n</body>\n</html>\n")


@dataclass
class GraphView:
    """A viewer page: ``data`` (what :func:`view_data` returns) and its HTML
    (:attr:`html`). Renders inline in Jupyter and VS Code notebooks (``_repr_html_``: the
    page in a sandboxed ``iframe``); :meth:`save` writes the page."""

    data: Dict[str, Any]
    title: str = "GLoMo graphs"

    def __post_init__(self):
        valid_text(self.title, "title")  # the page's <title>: a lone surrogate cannot be written

    @property
    def html(self) -> str:
        return render(self.data, self.title)

    def _repr_html_(self) -> str:
        height = 720 if self.data.get("kind") == "image" else 640
        return (f"<iframe srcdoc=\"{html.escape(self.html, quote=True)}\" "
                f"style=\"width: 100%; height: {height}px; border: 0\" "
                "sandbox=\"allow-scripts\"></iframe>")

    def save(self, path: Union[str, os.PathLike]) -> str:
        """Write the page to ``path`` (atomically); returns the path. One file, no other
        files needed: it opens from disk, offline."""
        from glomo_pyg.atomic_files import atomic_write

        path = check_output_path(path, "path")
        text = self.html
        if len(text.encode()) > MAX_PAGE_BYTES:
            raise ValueError(f"the page would take {len(text.encode()) >> 20} MB: raise "
                             "min_weight or lower top_k")
        with atomic_write(path) as fh:
            fh.write(text)
        return path


def view(predictor, text: Union[str, Sequence[str], None] = None, *, image=None, gold=None,
         min_weight: float = MIN_WEIGHT, top_k: Optional[int] = None, lower: bool = True,
         title: Optional[str] = None, sample: int = 0) -> GraphView:
    r"""Every graph a pretrained predictor emits for one sentence or one image, as an
    interactive page.

    Text (``text``: a sentence, tokenised as the predictor's corpus was, or its tokens):
    a *head view* (sources and targets in two columns, a line per edge whose opacity is
    its weight, a colour per head; direction, layer and heads are picked, the chained
    product :math:`G^1 \cdots G^l` is a layer choice, and hovering a token keeps only its
    incoming or outgoing edges) and a *matrix view* (all layers x heads as small heat
    maps, paper Fig. 3; a click opens one in the head view). With ``gold`` (a
    :class:`~glomo_pyg.analysis.treebank.GoldTree` of the same words, or their 1-based
    CoNLL heads) the gold arcs are drawn beside the learned ones and the page says how
    many targets' heaviest source is their gold head.

    Images (``image``: uint8 ``[3, H, W]`` or ``[H, W, 3]``, a PIL image or a regular
    file; a 16-bit or float PIL image or file is scaled to 8 bits, see
    :func:`~glomo_pyg.analysis.viewer.inputs.to_uint8`): the image, upscaled, and for the
    pixel under the pointer (or moved with the arrow keys) its incoming weights in every graph as overlays (paper Fig. 4).

    ``predictor`` may also be graphs already emitted (:class:`~glomo_pyg.LatentGraphs` or
    :class:`~glomo_pyg.DirectionalGraphs`, e.g. ``model.graphs(x, batch)``): ``sample``
    picks the sequence, whose tokens (or image) ``text`` (``image``) must be.

    Edges lighter than ``min_weight`` are left out, and with ``top_k`` all but each
    target's ``top_k`` heaviest (images: 8 by default), so pages stay small (a 32x32 image
    with 24 graphs: under 3 MB). The page is one HTML file with its data as JSON and its
    script inline: no network access, no CDN.

    Strings (``text``, its tokens, ``title``) must be valid UTF-8: a lone surrogate raises
    :class:`ValueError` naming the argument.

    Returns:
        a :class:`GraphView` (shown inline in a notebook; ``.save(path)``).
    """
    data = view_data(predictor, text, image=image, gold=gold, min_weight=min_weight,
                     top_k=top_k, lower=lower, sample=sample)
    if title is None:
        title = "GLoMo graphs: " + (" ".join(data["tokens"])[:60] if data["kind"] == "text"
                                    else f"{data['width']}x{data['height']} image")
    return GraphView(data, title)
