"""``glomo pretrain``: GLoMo pretraining on a real text corpus or image set with Lightning,
driven by one :class:`PretrainConfig`: the corpus is prepared once per output folder, a
:class:`~glomo_pyg.training.GlomoPretraining` module is trained (atomic checkpoints, exact
resume) and the graph predictor saved (docs/text.md, "glomo pretrain")."""
from glomo_pyg.training.pretrain.config import (
                                                  CorpusConfig,
                                                  PretrainConfig,
                                                  TrainConfig,
                                                  set_by_path,
)
from glomo_pyg.training.pretrain.corpus import iter_documents, prepare_corpus
from glomo_pyg.training.pretrain.data import ImagePretrainingData, TextPretrainingData
from glomo_pyg.training.pretrain.run import run_pretraining
from glomo_pyg.training.pretrain.trainer import build_trainer, last_checkpoint

__all__ = ["CorpusConfig", "ImagePretrainingData", "PretrainConfig", "TextPretrainingData",
           "TrainConfig", "build_trainer", "iter_documents", "last_checkpoint", "prepare_corpus",
           "run_pretraining", "set_by_path"]
