"""Do GLoMo's graphs add to transferred features? Frozen features ``H``, frozen graphs
``M`` and a linear probe on pooled ``[H ; M H]``, on all of IMDB and CIFAR-10.

Only the graph changes between the variants of a feature set: GLoMo's (a released
predictor), uniform over the same sources, the adjacent unit (chain), the 8-neighbour
pixel grid (images), and none (``H`` alone). Per sample, ``[H ; M H]`` is pooled by mean
and max over the units (and, for images, over a grid of regions); a multinomial logistic
regression (:class:`glomo_pyg.evaluation.LinearProbe`) has its L2 penalty chosen on a
validation split of the training set, is refit on all of it and scored once on the
test set, for 5 seeds of the split and initialisation. Differences come with paired
bootstrap intervals over test samples and seeds.

Stages, each cached under ``--output-dir`` (features in chunks, keyed by the predictor's
and the features' digests; an interrupted run resumes):

* ``moco``: MoCo pretraining of the image encoder (``configs/moco-imagenet32-cpu.yaml``).
* ``text``: word2vec features, graphs of ``imdb-text-cpu``, TF-IDF beside them.
* ``images``: MoCo's own linear probe (against a random encoder), then pixels and
  MoCo's stage-1 map as ``H`` with the pixel releases' graphs.
* ``report``: ``benchmarks/results/linear_probe.md`` from the cached results.

    python -m benchmarks.linear_probe all --data-dir DATA --output-dir runs/linear-probe
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from benchmarks.common import as_script, file_digest, hardware, run_reporting_errors
from glomo_pyg.evaluation.linear import L2_GRID

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MOCO_CONFIG = os.path.join(REPO, "configs", "moco-imagenet32-cpu.yaml")
RESULTS = os.path.join(REPO, "benchmarks", "results", "linear_probe.md")
STAGES = ("moco", "text", "images", "report", "all")
TEXT_GRAPHS = ("none", "glomo", "uniform", "adjacent")
IMAGE_GRAPHS = ("none", "glomo", "glomo-cpu", "uniform", "adjacent", "grid")
LABELS = {"none": "features alone", "glomo": "+ GLoMo", "glomo-cpu": "+ GLoMo (CPU release)",
          "uniform": "+ uniform", "adjacent": "+ chain (adjacent unit)", "grid": "+ grid"}


@dataclasses.dataclass
class Setup:
    """One configuration of the comparison (:data:`FULL`, or the tests' :data:`SMOKE`)."""

    review_length: int = 400
    text_predictor: str = "imdb-text-cpu"
    # the release learned its distance term on 64-token windows: keep the edges within
    text_max_distance: Optional[int] = 63
    # 100-d (as the reduced IMDB reproduction): [H ; M H] of 300-d vectors is 19,800
    # features per review, three times the propagation and probe cost
    vector_dim: int = 100
    vector_epochs: int = 5
    # word2vec's min_count: 3, or 1 for a tiny corpus (the two values the IMDB
    # reproduction's word_vectors knows)
    vector_min_count: int = 3
    # (variant, release, max_distance, heads): heads 'mean' averages each layer's graphs
    # over its heads (LatentGraphs.mean_heads): the GPU release's 48 graphs per image cost
    # too much on a CPU for 60,000 images, and one rule for every image variant
    image_predictors: Tuple = (("glomo", "imagenet32-pixel", None, "mean"),
                               ("glomo-cpu", "imagenet32-pixel-cpu", 15, "mean"))
    regions: Tuple[int, int] = (2, 2)
    max_reviews: Optional[int] = None  # per split; None: all 25,000
    max_images: Optional[int] = None  # per split; None: all 50,000 / 10,000
    seeds: int = 5
    l2_grid: Tuple[float, ...] = L2_GRID
    max_iter: int = 100
    batch: int = 16
    chunk: int = 1000  # samples per cached feature file
    resamples: int = 2000


FULL = Setup()
SMOKE = Setup(review_length=24, vector_dim=8, vector_epochs=1, vector_min_count=1,
              max_reviews=40, max_images=40, seeds=2, l2_grid=(1e-1, 1e-2), max_iter=10,
              batch=8, chunk=16, resamples=50)


def log(*args) -> None:
    print(time.strftime("%H:%M:%S"), *args, flush=True)


# ---------------------------------------------------------------- cached features

def feature_key(**parts) -> str:
    """The cache key of a feature matrix: a digest of everything it depends on (the
    predictor's and the features' digests, the graph variant, the settings)."""
    from glomo_pyg.digests import digest

    return digest(parts)[:32]


def cached_features(folder: str, name: str, key: str, count: int, chunk: int,
                    compute: Callable[[int, int], torch.Tensor]) -> torch.Tensor:
    """``[count, F]`` float16 features of samples ``0..count-1``, computed ``chunk`` at a
    time by ``compute(start, stop)`` and kept in ``folder/name.<start>.safetensors``
    (written atomically, with ``key`` in its metadata: a file with another key is
    recomputed)."""
    from safetensors import safe_open
    from safetensors.torch import save

    from glomo_pyg.atomic_files import atomic_write

    os.makedirs(folder, exist_ok=True)
    parts = []
    for start in range(0, count, chunk):
        stop = min(count, start + chunk)
        path = os.path.join(folder, f"{name}.{start:06d}.safetensors")
        if os.path.exists(path):
            with safe_open(path, "pt") as fh:
                if (fh.metadata() or {}).get("key") == key:
                    part = fh.get_tensor("features")
                    if part.size(0) == stop - start:
                        parts.append(part)
                        continue
        began = time.perf_counter()
        part = compute(start, stop).to(torch.float16).contiguous()
        with atomic_write(path, "wb", encoding=None) as fh:
            fh.write(save({"features": part}, metadata={
                "key": key, "seconds": f"{time.perf_counter() - began:.2f}"}))
        parts.append(part)
        log(f"{name}: {stop}/{count} ({time.perf_counter() - began:.0f} s for {stop - start})")
    return torch.cat(parts)


def feature_seconds(folder: str, name: str, count: int, chunk: int) -> float:
    """Seconds the cached chunks of ``name`` (:func:`cached_features` of ``count``
    samples ``chunk`` at a time) took to compute, as recorded then."""
    from safetensors import safe_open

    total = 0.0
    for start in range(0, count, chunk):
        with safe_open(os.path.join(folder, f"{name}.{start:06d}.safetensors"), "pt") as fh:
            total += float((fh.metadata() or {}).get("seconds", 0))
    return total


# ---------------------------------------------------------------- probes

def probe_runs(train: torch.Tensor, y_train: torch.Tensor, test: torch.Tensor,
               y_test: torch.Tensor, setup: Setup) -> Dict:
    """:class:`LinearProbe` for each seed: the chosen penalty, validation accuracies and
    the 0/1 outcome on every test sample."""
    from glomo_pyg.evaluation import LinearProbe

    runs = []
    for seed in range(setup.seeds):
        began = time.perf_counter()
        probe = LinearProbe(setup.l2_grid, max_iter=setup.max_iter, seed=seed).fit(train, y_train)
        correct = (probe.predict(test) == y_test)
        runs.append(dict(seed=seed, l2=probe.l2, validation=probe.validation_accuracy,
                         test_accuracy=float(correct.double().mean() * 100),
                         correct="".join("1" if c else "0" for c in correct.tolist()),
                         seconds=round(time.perf_counter() - began, 1)))
    return dict(runs=runs)


def cached_probe(path: str, key: str, run: Callable[[], Dict]) -> Dict:
    from glomo_pyg.atomic_files import write_json

    if os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            cached = json.load(fh)
        if cached.get("key") == key:
            return cached
    result = dict(run(), key=key)
    write_json(path, result)
    return result


def pooled_columns(features: torch.Tensor, poolings: int, keep: int) -> torch.Tensor:
    """The first ``keep`` of ``poolings`` pooling blocks (``mean`` first: ``keep=1`` is the
    mean-only probe)."""
    width = features.size(1) // poolings
    return features[:, :keep * width]


# ---------------------------------------------------------------- text

def selected(args, variants: Sequence[str]) -> List[str]:
    """The variants of a task that ``--skip`` leaves ('none' always stays)."""
    return [v for v in variants if v == "none" or v not in (args.skip or ())]


def transfer_graph(variant: str) -> str:
    """The ``GlomoTransfer(graph=...)`` of a variant (``grid``: any fixed graph, since
    its graphs are given)."""
    return "learned" if variant.startswith("glomo") else "uniform" if variant == "grid" \
        else variant


def release_path(name: str) -> str:
    return os.path.join(REPO, "pretrained", name)


def imdb_splits(args, setup: Setup) -> Dict[str, Tuple[list, List[List[str]], torch.Tensor]]:
    """Per split: the reviews, their tokens (cut to the review length) and labels."""
    from glomo_pyg.data import read_aclimdb, tokenize

    splits = {}
    for split in ("train", "test"):
        reviews = read_aclimdb(args.data_dir, split)
        if setup.max_reviews is not None:  # (the smoke test: an even spread of labels)
            reviews = reviews[::max(1, len(reviews) // setup.max_reviews)][:setup.max_reviews]
        tokens = [tokenize(r.text)[:setup.review_length] or ["<unk>"] for r in reviews]
        splits[split] = (reviews, tokens, torch.tensor([r.label for r in reviews]))
    return splits


def imdb_word_vectors(args, setup: Setup, out: str):
    """``(table, index, digest, shape)``: the word2vec table (row 0 for words without a
    vector), each word's row, the vectors file's digest and the vectors' shape."""
    from benchmarks.reproduce.imdb import FULL as IMDB_FULL
    from benchmarks.reproduce.imdb import word_vectors

    vectors_setup = dataclasses.replace(IMDB_FULL, vector_dim=setup.vector_dim,
                                        vector_epochs=setup.vector_epochs)
    words, vectors = word_vectors(argparse.Namespace(
        data_dir=args.data_dir, smoke=setup.vector_min_count == 1, workers=args.threads),
        vectors_setup, out)
    table = torch.cat([torch.zeros(1, vectors.shape[1]), torch.from_numpy(vectors)])
    index = {w: i + 1 for i, w in enumerate(words)}
    return table, index, file_digest(os.path.join(out, "word_vectors.txt")), vectors.shape


def text_features(predictor, table: torch.Tensor, index: Dict[str, int], setup: Setup,
                  variant: str, tokens: List[List[str]]) -> Callable[[int, int], torch.Tensor]:
    """The feature rows of reviews ``start:stop`` for :func:`cached_features`."""
    from glomo_pyg.evaluation import probe_features
    from glomo_pyg.nn import GlomoTransfer

    transfer = GlomoTransfer(predictor, table.size(1), graph=transfer_graph(variant),
                             max_distance=setup.text_max_distance)

    def run(start: int, stop: int) -> torch.Tensor:
        ids = list(range(start, stop))
        ids.sort(key=lambda k: len(tokens[k]))  # similar lengths share a batch
        rows = []
        for b0 in range(0, len(ids), setup.batch):
            docs = [tokens[k] for k in ids[b0:b0 + setup.batch]]
            flat = [t for d in docs for t in d]
            batch = torch.arange(len(docs)).repeat_interleave(
                torch.tensor([len(d) for d in docs]))
            h = table[torch.tensor([index.get(t, 0) for t in flat])]
            x = predictor.encode(flat, unknown="<unk>")
            with torch.no_grad():
                rows.append(probe_features(transfer, h, batch, x=x))
        features = torch.cat(rows)
        return features[torch.tensor(ids).argsort()]

    return run


def text_stage(args, setup: Setup) -> Dict:
    from benchmarks.reproduce.imdb import tfidf_baseline
    from glomo_pyg.nn import PretrainedGraphPredictor

    out = os.path.join(args.output_dir, "text")
    os.makedirs(out, exist_ok=True)
    table, index, vectors_digest, shape = imdb_word_vectors(args, setup, out)
    predictor = PretrainedGraphPredictor.from_pretrained(release_path(setup.text_predictor))
    predictor.set_layout("fused")
    graphs_digest = predictor.fingerprint()
    splits = imdb_splits(args, setup)
    y_train, y_test = splits["train"][2], splits["test"][2]
    results: Dict = dict(tfidf=None, variants={})
    for variant in selected(args, TEXT_GRAPHS):
        features = {}
        for split, (reviews, tokens, _) in splits.items():
            key = feature_key(task="text", split=split, variant=variant, vectors=vectors_digest,
                              predictor=graphs_digest if variant != "none" else None,
                              max_distance=setup.text_max_distance, length=setup.review_length,
                              reviews=len(reviews), poolings=["mean", "max"])
            features[split] = cached_features(
                os.path.join(out, "features"), f"{split}-{variant}", key, len(tokens),
                setup.chunk, text_features(predictor, table, index, setup, variant, tokens))
        for keep, pooling in ((1, "mean"), (2, "mean+max")):
            name = f"{variant}-{pooling}"
            key = feature_key(features=feature_key(v=variant, d=vectors_digest, p=graphs_digest),
                              pooling=pooling, setup=dataclasses.asdict(setup))
            log(f"text: probe {name} ({features['train'].size(1) * keep // 2} features)")
            results["variants"][name] = cached_probe(
                os.path.join(out, f"probe-{name}.json"), key, lambda: probe_runs(
                    pooled_columns(features["train"], 2, keep), y_train,
                    pooled_columns(features["test"], 2, keep), y_test, setup))
        results["variants"][f"{variant}-mean+max"]["feature_seconds"] = sum(
            feature_seconds(os.path.join(out, "features"), f"{s}-{variant}", len(v[1]),
                            setup.chunk) for s, v in splits.items())
    texts = {s: ([r.text for r in v[0]], [r.label for r in v[0]]) for s, v in splits.items()}
    results["tfidf"] = tfidf_probe(out, texts, setup, tfidf_baseline)
    results["settings"] = dict(predictor=setup.text_predictor, vectors=list(shape),
                               layers=predictor.num_layers, heads=predictor.heads,
                               max_distance=setup.text_max_distance,
                               reviews={s: len(v[0]) for s, v in splits.items()})
    return results


def tfidf_probe(out: str, texts: Dict, setup: Setup, baseline) -> Dict:
    """TF-IDF + logistic regression (``benchmarks.reproduce.imdb.tfidf_baseline``): fit on
    90% of the training reviews, its C chosen on the other 10%, scored once on the test
    reviews."""
    def run() -> Dict:
        train_texts, train_labels = texts["train"]
        order = torch.randperm(len(train_texts), generator=torch.Generator().manual_seed(0))
        held = max(1, len(order) // 10)
        def pick(ids):
            return [train_texts[k] for k in ids], [train_labels[k] for k in ids]

        fit = baseline(pick(order[held:].tolist()), pick(order[:held].tolist()), texts["test"],
                       max_length=setup.review_length)
        return dict(fit, test_accuracy=fit["test_acc"] * 100)

    return cached_probe(os.path.join(out, "tfidf.json"), feature_key(
        tfidf=True, setup=dataclasses.asdict(setup), n=len(texts["train"][0])), run)


# ---------------------------------------------------------------- MoCo

def moco_settings(path: str = MOCO_CONFIG):
    import yaml

    from glomo_pyg.training.moco import MocoConfig

    with open(path, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    return int(data["max_images"]), MocoConfig.from_dict(data["moco"])


def moco_stage(args, setup: Setup) -> Dict:
    """The MoCo encoder in ``OUT/moco`` (pretrained once; resumed when interrupted)."""
    from glomo_pyg.data.images import load_imagenet32
    from glomo_pyg.logs import lines_to, logging_to
    from glomo_pyg.training.moco import ENCODER_CONFIG, MocoConfig, load_encoder, pretrain_moco

    folder = os.path.join(args.output_dir, "moco")
    max_images, config = moco_settings(args.moco_config)
    summary = load_encoder(folder)[1] if os.path.exists(os.path.join(folder, ENCODER_CONFIG)) \
        else None
    if summary is not None and (MocoConfig.from_dict(summary["config"]).result_settings() !=
                                config.result_settings() or summary["images"] != max_images):
        raise ValueError(f"{folder} holds an encoder pretrained with other settings than "
                         f"{args.moco_config}; use another --output-dir or delete it")
    if summary is None or summary["steps"] < config.max_steps:  # (or stopped by the clock)
        images, _ = load_imagenet32(os.path.join(args.data_dir, "imagenet32"), max_images)
        log(f"moco: {images.size(0)} images, {config.max_steps} steps in {folder}")
        with logging_to(lines_to(log), propagate=False):  # (its lines, as log's)
            summary = pretrain_moco(images, config, folder)
    return summary


# ---------------------------------------------------------------- images

#: the two feature sets of the image probe, as channel ranges of the concatenated ``H``
IMAGE_FEATURES = {"pixels": (0, 3), "moco": (3, None)}


def image_units_features(images: torch.Tensor, encoder) -> Tuple[torch.Tensor, torch.Tensor,
                                                                  torch.Tensor]:
    """``(x, batch, h)`` of uint8 images: the pixel units, and ``H`` = their normalised
    values beside the encoder's stage-1 map (one row per pixel, raster order)."""
    from glomo_pyg.pixels import IMAGENET_MEAN, IMAGENET_STD, image_units, normalize

    x, batch = image_units(images)
    with torch.no_grad():
        maps = torch.cat([normalize(images, IMAGENET_MEAN, IMAGENET_STD),
                          encoder.feature_map(images)], 1)  # [B, 3 + c1, H, W]
    return x, batch, maps.permute(0, 2, 3, 1).reshape(x.size(0), maps.size(1))


def image_transfer(variant: str, setup: Setup, releases: Dict, channels: int):
    """``(transfer, max_distance)`` of a variant; the fixed graphs take the CPU release's
    shape (2 layers), so their products reach as far."""
    from glomo_pyg.nn import GlomoTransfer

    name = variant if variant.startswith("glomo") else "glomo-cpu"
    predictor, max_distance = releases[name]
    return GlomoTransfer(predictor, channels, graph=transfer_graph(variant),
                         max_distance=max_distance if variant.startswith("glomo") else None)


def channel_columns(features: torch.Tensor, channels: int, keep: Tuple[int, Optional[int]],
                    poolings: int, keep_poolings: int) -> torch.Tensor:
    """The columns of one feature set (channels ``keep[0]:keep[1]`` of every part) and of
    the first ``keep_poolings`` poolings, from (pooling, region, part, channel) features."""
    b = features.size(0)
    shaped = features.view(b, poolings, -1, channels)[:, :keep_poolings, :, keep[0]:keep[1]]
    return shaped.reshape(b, -1)


def cifar_data(args, setup: Setup) -> Dict[str, Tuple[torch.Tensor, torch.Tensor]]:
    """Per split: CIFAR-10's uint8 images and labels (the first ``max_images`` if set)."""
    from glomo_pyg.data.images import load_cifar10

    data = {}
    for split in ("train", "test"):
        images, labels = load_cifar10(os.path.join(args.data_dir, "cifar-10-batches-py"), split)
        if setup.max_images is not None:
            images, labels = images[:setup.max_images], labels[:setup.max_images]
        data[split] = (images, labels)
    return data


def global_probes(out: str, setup: Setup, data: Dict, encoders: Dict) -> Dict:
    """MoCo's own protocol: a linear classifier on each encoder's frozen global features
    (``encoders``: name -> (encoder, digest))."""
    results = {}
    for name, (model, digest_) in encoders.items():
        def pooled(start: int, stop: int, split: str, model=model) -> torch.Tensor:
            with torch.no_grad():
                return model(data[split][0][start:stop])
        feats = {split: cached_features(
            os.path.join(out, "features"), f"{split}-global-{name}",
            feature_key(task="global", split=split, encoder=digest_,
                        images=len(data[split][0])),
            len(data[split][0]), setup.chunk, lambda a, b, split=split: pooled(a, b, split))
            for split in data}
        results[name] = cached_probe(
            os.path.join(out, f"probe-global-{name}.json"),
            feature_key(encoder=digest_, setup=dataclasses.asdict(setup)),
            lambda: probe_runs(feats["train"], data["train"][1], feats["test"],
                               data["test"][1], setup))
    return results


def image_features(transfer, encoder, variant: str, setup: Setup, images: torch.Tensor,
                   regions: Tuple[int, ...], heads) -> Callable[[int, int], torch.Tensor]:
    """The pooled feature rows of images ``start:stop`` for :func:`cached_features`."""
    from glomo_pyg.evaluation import grid_graphs, probe_features
    from glomo_pyg.graphs import DirectionalGraphs

    p, size = transfer.predictor, tuple(images.shape[2:])

    def run(start: int, stop: int) -> torch.Tensor:
        rows = []
        for b0 in range(start, stop, setup.batch):
            x, batch, h = image_units_features(images[b0:min(stop, b0 + setup.batch)], encoder)
            graphs = None
            if variant == "grid":
                ptr = torch.arange(0, x.size(0) + 1, size[0] * size[1])
                graphs = DirectionalGraphs(*(grid_graphs(
                    ptr, *size, num_layers=p.num_layers, num_heads=p.heads, direction=d)
                    for d in ("forward", "backward")))
            with torch.no_grad():
                rows.append(probe_features(
                    transfer, h, batch, x=None if graphs is not None else x, graphs=graphs,
                    regions=regions, heads=heads))
        return torch.cat(rows)

    return run


def image_variant_probes(out: str, setup: Setup, data: Dict, features: Dict, variant: str,
                         channels: int, key_parts: Dict) -> Dict:
    """The probes of one graph variant: each feature set, mean and mean + max pooling."""
    results = {}
    for feature_set, keep in IMAGE_FEATURES.items():
        for keep_poolings, pooling in ((1, "mean"), (2, "mean+max")):
            name = f"{feature_set}-{variant}-{pooling}"
            cols = {s: channel_columns(f, channels, keep, 2, keep_poolings)
                    for s, f in features.items()}
            log(f"images: probe {name} ({cols['train'].size(1)} features)")
            key = feature_key(features=feature_key(v=variant, **key_parts), name=name,
                              setup=dataclasses.asdict(setup))
            results[name] = cached_probe(
                os.path.join(out, f"probe-{name}.json"), key, lambda: probe_runs(
                    cols["train"], data["train"][1], cols["test"], data["test"][1], setup))
    return results


def image_stage(args, setup: Setup) -> Dict:
    from glomo_pyg.nn import PretrainedGraphPredictor
    from glomo_pyg.training.moco import ENCODER_WEIGHTS, build_moco, load_encoder

    moco_summary = moco_stage(args, setup)
    out = os.path.join(args.output_dir, "images")
    encoder = load_encoder(os.path.join(args.output_dir, "moco"))[0]
    moco_config = moco_settings(args.moco_config)[1]
    random_encoder = build_moco(moco_config).encoder.eval()  # MoCo's starting point
    encoder_digest = file_digest(os.path.join(args.output_dir, "moco", ENCODER_WEIGHTS))
    data = cifar_data(args, setup)
    results: Dict = dict(moco=dict(summary=moco_summary), variants={})
    results["moco"].update(global_probes(out, setup, data, dict(
        moco=(encoder, encoder_digest),
        random=(random_encoder, feature_key(random=moco_config.result_settings())))))
    releases = {}
    for name, release, max_distance, _heads in setup.image_predictors:
        predictor = PretrainedGraphPredictor.from_pretrained(release_path(release))
        releases[name] = (predictor.set_layout("fused"), max_distance)
    digests = {name: p.fingerprint() for name, (p, _) in releases.items()}
    heads = {name: h for name, _, _, h in setup.image_predictors}
    channels = 3 + encoder.channels[0]
    regions = (*data["train"][0].shape[2:], *setup.regions)
    for variant in selected(args, IMAGE_GRAPHS):
        transfer = image_transfer(variant, setup, releases, channels)
        features = {split: cached_features(
            os.path.join(out, "features"), f"{split}-{variant}", feature_key(
                task="images", split=split, variant=variant, encoder=encoder_digest,
                predictor=digests.get(variant, digests["glomo-cpu"]) if variant != "none"
                else None, max_distance=transfer.max_distance, regions=list(regions),
                heads=heads.get(variant, "mean"), images=len(data[split][0])),
            len(data[split][0]), setup.chunk, image_features(
                transfer, encoder, variant, setup, data[split][0], regions,
                heads.get(variant, "mean"))) for split in data}
        results["variants"].update(image_variant_probes(
            out, setup, data, features, variant, channels,
            dict(e=encoder_digest, p=digests, h=heads)))
        results["variants"][f"moco-{variant}-mean+max"]["feature_seconds"] = sum(
            feature_seconds(os.path.join(out, "features"), f"{s}-{variant}", len(v[0]),
                            setup.chunk) for s, v in data.items())
    results["settings"] = dict(images={s: len(v[0]) for s, v in data.items()},
                               regions=list(setup.regions), channels=channels,
                               predictors=[list(p) for p in setup.image_predictors])
    return results


# ---------------------------------------------------------------- report

def outcomes(entry: Dict) -> torch.Tensor:
    """``[seeds, test samples]`` 0/1 outcomes of a probe's runs."""
    return torch.tensor([[c == "1" for c in run["correct"]] for run in entry["runs"]])


def mean_accuracy(entry: Dict) -> float:
    return sum(r["test_accuracy"] for r in entry["runs"]) / len(entry["runs"])


def difference(a: Dict, b: Dict, setup: Setup) -> Tuple[float, float, float]:
    """Paired bootstrap difference ``a - b`` (points) over the test samples and seeds."""
    from glomo_pyg.evaluation import paired_bootstrap

    return paired_bootstrap(outcomes(a), outcomes(b), resamples=setup.resamples)


def interval(d: Tuple[float, float, float]) -> str:
    return f"{d[0]:+.2f} [{d[1]:+.2f}, {d[2]:+.2f}]"


def verdict(d: Tuple[float, float, float]) -> str:
    return "met" if d[1] > 0 else "not met (worse)" if d[2] < 0 else \
        "not met (the interval includes 0)"


def variant_rows(variants: Dict, prefix: str, graphs: Sequence[str], setup: Setup) -> List[str]:
    """Table rows: each graph variant's accuracy (mean-only and mean+max pooling) and its
    paired difference from the features alone and from GLoMo (mean+max; the CPU release's
    where the GPU release did not run)."""
    reference = next((g for g in ("glomo", "glomo-cpu") if f"{prefix}{g}-mean+max" in variants),
                     None)
    rows = ["| graph | mean pooling | mean + max pooling | − features alone | "
            f"{LABELS.get(reference, 'GLoMo').lstrip('+ ')} − this | "
            "penalties chosen |", "|---|---|---|---|---|---|"]
    alone = variants.get(f"{prefix}none-mean+max")
    glomo = variants.get(f"{prefix}{reference}-mean+max")
    for g in graphs:
        mean, full = variants.get(f"{prefix}{g}-mean"), variants.get(f"{prefix}{g}-mean+max")
        if full is None:
            continue
        vs_alone = "" if g == "none" else interval(difference(full, alone, setup))
        vs_glomo = "" if g.startswith("glomo") or glomo is None else \
            interval(difference(glomo, full, setup))
        chosen = ", ".join(f"{r['l2']:g}" for r in full["runs"])
        rows.append(f"| {LABELS[g]} | {mean_accuracy(mean):.2f} | {mean_accuracy(full):.2f} | "
                    f"{vs_alone} | {vs_glomo} | {chosen} |")
    return rows


def answers(variants: Dict, prefix: str, graph: str, others: Sequence[str],
            setup: Setup) -> List[str]:
    """The questions of the comparison for one graph variant, met or not (mean+max), and
    its difference from the features alone under mean pooling only."""
    mine = variants.get(f"{prefix}{graph}-mean+max")
    if mine is None:
        return []
    out = []
    mean, alone = variants.get(f"{prefix}{graph}-mean"), variants.get(f"{prefix}none-mean")
    if mean is not None and alone is not None:
        out.append(f"- (mean pooling only: {LABELS[graph]} − features alone "
                   f"{interval(difference(mean, alone, setup))} points)")
    for other in ("none",) + tuple(others):
        theirs = variants.get(f"{prefix}{other}-mean+max")
        if theirs is not None:
            d = difference(mine, theirs, setup)
            out.append(f"- {LABELS[graph]} beats {LABELS[other].removeprefix('+ ')}: "
                       f"{interval(d)} points: **{verdict(d)}**")
    return out


def seconds_line(variants: Dict, prefix: str, graphs: Sequence[str]) -> str:
    parts = []
    for g in graphs:
        entry = variants.get(f"{prefix}{g}-mean+max")
        if entry is not None and "feature_seconds" in entry:
            parts.append(f"{g} {entry['feature_seconds'] / 60:.1f}")
    probes = sum(r["seconds"] for k, v in variants.items() if k.startswith(prefix)
                 for r in v["runs"])
    return (f"Time (wall clock): features (graphs included), minutes: {', '.join(parts)}; "
            f"the "
            f"{sum(len(v['runs']) for k, v in variants.items() if k.startswith(prefix))} "
            f"probe fits {probes / 60:.1f} min.")


def load_results(output_dir: str) -> Dict[str, Dict]:
    """The stages' ``text.json`` and ``images.json`` found in ``output_dir``."""
    loaded = {}
    for task in ("text", "images"):
        file = os.path.join(output_dir, f"{task}.json")
        if os.path.exists(file):
            with open(file, encoding="utf-8") as fh:
                loaded[task] = json.load(fh)
    if not loaded:
        raise ValueError(f"{output_dir} holds no text.json or images.json: run the "
                         "text and images stages first")
    return loaded


def text_sections(t: Dict, setup: Setup) -> Tuple[List[str], List[str]]:
    """``(answer lines, section lines)`` of the IMDB task."""
    v, settings = t["variants"], t["settings"]
    summary = [f"**IMDB** (word2vec {settings['vectors'][1]}-d, `{settings['predictor']}`):"]
    summary += answers(v, "", "glomo", ("uniform", "adjacent"), setup)
    body = [f"## IMDB: {settings['reviews']['train']:,} training and "
            f"{settings['reviews']['test']:,} test reviews", "",
            f"`H`: word2vec vectors ({settings['vectors'][1]}-d, trained on all the "
            f"reviews, labels unused). `M`: the graphs of `{settings['predictor']}` "
            f"({settings['layers']} layers x {settings['heads']} heads x 2 directions, "
            f"and their products: {2 * settings['layers'] * settings['heads']} "
            f"components per direction), edges kept within {settings['max_distance']} "
            "tokens (the "
            "release learned its distance term on 64-token windows). Reviews cut to "
            f"{setup.review_length} tokens. Test accuracy (%), mean of "
            f"{len(v['none-mean+max']['runs'])} seeds; differences in points with 95% "
            "paired bootstrap intervals.", ""]
    body += variant_rows(v, "", TEXT_GRAPHS, setup)
    tfidf = t["tfidf"]
    body += ["", f"TF-IDF (word 1-2-grams) + logistic regression on the same split: "
                 f"**{tfidf['test_accuracy']:.2f}%** (C = {tfidf['C']}, "
                 f"{tfidf['features']:,} features).", "", seconds_line(v, "", TEXT_GRAPHS),
             ""]
    return summary, body


def moco_lines(moco: Dict, setup: Setup) -> Tuple[List[str], List[str]]:
    """``(answer lines, table lines)`` of MoCo's own linear-probe protocol."""
    d = difference(moco["moco"], moco["random"], setup)
    learned = d[1] >= 5.0
    summary = ["", f"**MoCo** (linear probe on its frozen global features): "
                   f"{mean_accuracy(moco['moco']):.2f}% against "
                   f"{mean_accuracy(moco['random']):.2f}% for a random encoder, "
                   f"{interval(d)} points: **{'learned' if learned else 'not learned'}** "
                   "(a clear margin: the interval above +5 points)."]
    table = ["MoCo's own protocol (a linear classifier on the encoder's frozen global "
             "features, the mean of stage 3):", "",
             "| encoder | test accuracy (%) |", "|---|---|",
             f"| MoCo ({moco['summary'].get('steps')} steps, "
             f"{moco['summary'].get('seconds', 0) / 60:.0f} min) | "
             f"{mean_accuracy(moco['moco']):.2f} |",
             f"| random (its initialisation) | {mean_accuracy(moco['random']):.2f} |", ""]
    return summary, table


def image_notes(v: Dict, setup: Setup) -> List[str]:
    """What the image section says about variants not run and penalties at the edge."""
    notes = []
    skipped = [g for g in IMAGE_GRAPHS if g != "glomo" and f"moco-{g}-mean+max" not in v]
    if skipped:
        notes += [f"Not run here: {', '.join(LABELS[g] for g in skipped)} (the time "
                  "left; `--skip` not given runs them).", ""]
    edge = [k for k, e in v.items() if all(r["l2"] == min(setup.l2_grid) for r in e["runs"])]
    if edge:
        notes += [f"The weakest penalty tried ({min(setup.l2_grid):g}) was chosen by every "
                  f"seed of {len(edge)} of these {len(v)} probes: with 45,000 training images "
                  "they are nearly unregularised; weaker penalties were not tried.", ""]
    if "moco-glomo-mean+max" not in v:
        notes += ["Not run here: + GLoMo with the GPU release `imagenet32-pixel` (3 layers "
                  "x 8 heads x 2 directions). `GlomoTransfer` with it runs at about 9 "
                  "images/s on this CPU ([image_graphs_cpu.md](image_graphs_cpu.md)), so "
                  "its graphs for 60,000 images alone take about two hours; the command "
                  "without `--skip glomo` adds it.", ""]
    return notes


def image_sections(im: Dict, setup: Setup) -> Tuple[List[str], List[str]]:
    """``(answer lines, section lines)`` of the CIFAR-10 task."""
    v, settings = im["variants"], im["settings"]
    summary, moco_table = moco_lines(im["moco"], setup)
    for feature_set in IMAGE_FEATURES:
        summary += ["", f"**CIFAR-10, H = {feature_set}**:"]
        for g in ("glomo", "glomo-cpu"):
            summary += answers(v, f"{feature_set}-", g, ("uniform", "adjacent", "grid"),
                               setup)
    body = [f"## CIFAR-10: {settings['images']['train']:,} training and "
            f"{settings['images']['test']:,} test images", ""] + moco_table + [
            f"Pooling: mean and max over each image and a {settings['regions'][0]}x"
            f"{settings['regions'][1]} grid of regions. Graphs averaged over the heads of "
            "each layer (`LatentGraphs.mean_heads`), with their products.", ""]
    for feature_set in IMAGE_FEATURES:
        body += [f"### H = {feature_set}" + (" (normalised RGB)" if feature_set == "pixels"
                                             else f" (MoCo's stage-1 map, "
                                             f"{settings['channels'] - 3} channels)"), ""]
        body += variant_rows(v, f"{feature_set}-", IMAGE_GRAPHS, setup) + [""]
    body += [seconds_line(v, "moco-", IMAGE_GRAPHS), ""]
    return summary, body + image_notes(v, setup)


def report(args, setup: Setup, path: str = RESULTS) -> str:
    """``benchmarks/results/linear_probe.md`` from the stages' results in ``--output-dir``."""
    from glomo_pyg.atomic_files import atomic_write

    loaded = load_results(args.output_dir)
    summary: List[str] = []
    body: List[str] = []
    for task, sections in (("text", text_sections), ("images", image_sections)):
        if task in loaded:
            more, section = sections(loaded[task], setup)
            summary += more
            body += section
    first = next(iter(loaded.values()))
    text = "\n".join(
        ["# Linear probe: do GLoMo's graphs add to transferred features?", "",
         f"Answer ({first['date']}, {first['hardware']}"
         + (f"; {args.note}" if args.note else "") + "): a linear probe on pooled "
         "`[H ; M H]`, only the graph changing between rows.", ""] + summary + [""] + body +
        ["## Command", "", "```sh",
         "python -m benchmarks.linear_probe all --data-dir DATA --output-dir runs/linear-probe",
         "python -m benchmarks.linear_probe report --data-dir DATA --output-dir runs/linear-probe",
         "```", ""])
    with atomic_write(path) as fh:
        fh.write(text)
    return text


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=STAGES)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--output-dir", default="runs/linear-probe")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--moco-config", default=MOCO_CONFIG)
    parser.add_argument("--skip", nargs="*", choices=sorted(set(IMAGE_GRAPHS) - {"none"}),
                        help="graph variants left out (e.g. glomo: the GPU release's graphs "
                             "for 60,000 images take hours on a CPU)")
    parser.add_argument("--results", default=RESULTS, help="the markdown report written")
    parser.add_argument("--note", default="", help="how the machine was used, for the report")
    parser.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)  # tests only
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    setup = SMOKE if args.smoke else FULL
    torch.set_num_threads(args.threads)
    stages = {"moco": moco_stage, "text": text_stage, "images": image_stage,
              "report": lambda a, s: report(a, s, args.results)}
    for stage in (("moco", "text", "images", "report") if args.stage == "all"
                  else (args.stage,)):
        def run(stage=stage):
            result = stages[stage](args, setup)
            from glomo_pyg.atomic_files import write_json

            if stage in ("text", "images"):
                write_json(os.path.join(args.output_dir, f"{stage}.json"), dict(
                    result, hardware=hardware(), date=time.strftime("%Y-%m-%d")))
        run_reporting_errors("linear_probe", run)


if __name__ == "__main__":
    as_script(main)
