"""``glomo pretrain``: GLoMo pretraining on a real text corpus or image set with Lightning.

One configuration (YAML file and/or command-line overrides, :class:`PretrainConfig`)
drives the whole run:

1. **Corpus** (once per output folder): documents are read (a text file or folder, or
   the aclImdb layout), tokenised, a vocabulary is built and the corpus is written as
   memory-mapped token shards (``<output>/tokens``), reused by later and resumed runs.
   Images (``corpus.format`` ``cifar10`` or ``imagenet32``, paper Sec. 3.5) are read
   from their pickle batches instead (plain data only), one sequence of pixel units
   each; ``model`` then holds the options of :meth:`Glomo.image <glomo_pyg.Glomo.image>`.
2. **Training**: :class:`~glomo_pyg.training.GlomoPretraining` under a Lightning
   ``Trainer`` (bf16 autocast on GPU, DDP over devices and nodes), CSV or TensorBoard
   logs with graph statistics, periodic and final checkpoints written atomically.
   ``resume=True`` continues exactly from the newest usable checkpoint (weights,
   optimiser, schedule, step, random state, position in the epoch's data order). A
   damaged checkpoint is named (and an older one taken, with a warning); one of another
   model or corpus is refused (each records the run's settings and a corpus
   fingerprint). SIGTERM or SIGINT finishes the step, writes ``last.ckpt`` and raises
   :class:`~glomo_pyg.training.interrupts.TrainingInterrupted` (exit 143 or 130).
3. **Result**: the pretrained graph predictor with its vocabulary,
   ``save_pretrained(<output>/predictor)``.

Modules: :mod:`.config` (settings), :mod:`.module` (the Lightning module), :mod:`.corpus`
(token shards, fingerprints), :mod:`.data` (data modules), :mod:`.callbacks`,
:mod:`.trainer`, :mod:`.vectors` (initial embeddings), :mod:`.run` (:func:`run_pretraining`).
"""
from glomo_pyg.training.pretrain.config import (CorpusConfig, PretrainConfig, TrainConfig,
                                                  set_by_path)
from glomo_pyg.training.pretrain.corpus import iter_documents, prepare_corpus
from glomo_pyg.training.pretrain.data import ImagePretrainingData, TextPretrainingData
from glomo_pyg.training.pretrain.trainer import build_trainer, last_checkpoint
from glomo_pyg.training.pretrain.run import run_pretraining

__all__ = ["CorpusConfig", "ImagePretrainingData", "PretrainConfig", "TextPretrainingData",
           "TrainConfig", "build_trainer", "iter_documents", "last_checkpoint", "prepare_corpus",
           "run_pretraining", "set_by_path"]
