"""Builders of small pretraining runs for the reliability tests: a toy corpus and the
settings of a 6-step run (checkpoints at steps 2, 4 and 6)."""
import random
from pathlib import Path

import torch

WORDS = "the cat sat on a mat and dog ran to park it was good bad movie film".split()


def write_corpus(folder, documents: int = 30, seed: int = 0) -> Path:
    rng = random.Random(seed)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for k in range(documents):
        (folder / f"doc{k:03d}.txt").write_text(
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(10, 60))) + ".")
    return folder


def pretrain_settings(out, corpus, **train) -> dict:
    options = dict(batch_size=4, max_steps=6, checkpoint_every=2, validate_every=3,
                   log_every=1, graph_stats_every=2, progress_bar=False, accelerator="cpu",
                   graph_warmup_steps=2, seed=1, threads=1)
    options.update(train)
    return dict(output_dir=str(out),
                corpus=dict(path=str(corpus), min_count=1, max_length=16, min_length=4,
                            validation_fraction=0.1),
                model=dict(hidden_channels=16, num_layers=2, heads=2, cnn_layers=1,
                           num_positions=4),
                train=options)


def without_recorded_settings(path) -> None:
    """Rewrite a checkpoint as glomo_pyg 0.2.0 wrote it: the corpus fingerprint alone, no
    settings record (its resume is checked against config.json)."""
    from glomo_pyg.training.checkpoints import atomic_save
    data = torch.load(path, weights_only=True)
    data["glomo"] = dict(version=1, corpus=data["glomo"]["corpus"])
    atomic_save(data, path)
