"""``glomo pretrain``: GLoMo pretraining on a real text corpus or image set with Lightning.

One configuration (YAML file and/or command-line overrides, :class:`PretrainConfig`)
drives the whole run:

1. **Corpus** (once per output folder): documents are read (a text file or folder, or
   the aclImdb layout), tokenised (:func:`~glomo_pyg.data.tokenize`), a vocabulary is
   built (``min_count``/``max_size``) and the corpus is written as memory-mapped token
   shards (``<output>/tokens``). Later runs and resumed runs reuse them.
2. **Training**: :class:`~glomo_pyg.training.GlomoPretraining` under a Lightning
   ``Trainer`` (progress bar, bf16 autocast on GPU, DDP over devices and nodes through
   Lightning's own strategy), CSV or TensorBoard logs with graph statistics
   (:class:`~glomo_pyg.training.GraphStatistics`), periodic and final checkpoints
   (``<output>/checkpoints``, written atomically: temporary file, fsync, rename).
   ``resume=True`` continues from the newest usable checkpoint (``last.ckpt``, or a
   newer periodic one when a kill came between the two) exactly where it stopped:
   weights, optimiser, schedule, step, random state, and the position inside the
   epoch's data order. Checkpoints are loaded with ``weights_only=True`` (nothing
   unpickled); a damaged one is named (and an older usable one taken instead, with a
   warning), one of another model or corpus is refused (every checkpoint records the
   run's settings and a corpus fingerprint: vocabulary, counts and token hash). SIGTERM
   or SIGINT while training finishes the step, writes ``last.ckpt`` and stops with
   :class:`~glomo_pyg.training.interrupts.TrainingInterrupted` (``glomo pretrain``
   exits with 143 or 130).
3. **Result**: the pretrained graph predictor with its vocabulary,
   ``save_pretrained(<output>/predictor)``.

Images (``corpus.format: cifar10`` or ``imagenet32``, paper Sec. 3.5) skip step 1: the
uint8 images are read from their pickle batches (:mod:`glomo_pyg.data.images`, never
unpickling anything but plain data) and every image is one sequence of pixel units;
``model`` then holds the options of :meth:`Glomo.image <glomo_pyg.Glomo.image>`.

The package: :mod:`.config` (settings), :mod:`.corpus` (token shards, fingerprints),
:mod:`.data` (data modules), :mod:`.callbacks`, :mod:`.trainer`, :mod:`.vectors` (initial
embeddings) and :mod:`.run` (:func:`run_pretraining`).
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
