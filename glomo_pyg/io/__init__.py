"""File formats of glomo_pyg (kept out of ``glomo_pyg.nn``)."""
from glomo_pyg.io.pretrained import (
                                     FORMAT_VERSION,
                                     PretrainedFormatError,
                                     load_pretrained,
                                     save_pretrained,
)

__all__ = ["FORMAT_VERSION", "PretrainedFormatError", "load_pretrained", "save_pretrained"]
