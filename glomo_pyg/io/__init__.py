"""File formats of glomo_pyg (kept out of ``glomo_pyg.nn``)."""
# (hub registers the hf:// route and push_to_hub; it imports huggingface_hub only when used)
from glomo_pyg.io import hub  # noqa: F401
from glomo_pyg.io.pretrained import (
                                     FORMAT_VERSION,
                                     PretrainedFormatError,
                                     load_pretrained,
                                     save_pretrained,
)

__all__ = ["FORMAT_VERSION", "PretrainedFormatError", "load_pretrained", "save_pretrained"]
