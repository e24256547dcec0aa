"""Files of glomo_pyg: the saved predictors' format, the Hugging Face Hub route, released
predictors, paths and images. Nothing here builds a module; the modules of
:mod:`glomo_pyg.nn` reach their files through it (loading and saving a predictor:
:func:`glomo_pyg.load_pretrained`, :func:`glomo_pyg.save_pretrained`)."""
from glomo_pyg.io.pretrained import FORMAT_VERSION, PretrainedFormatError

__all__ = ["FORMAT_VERSION", "PretrainedFormatError"]
