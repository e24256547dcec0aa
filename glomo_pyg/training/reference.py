"""The settings reference, ``docs/settings.md``, written from the declarations of every
layer's settings (:data:`REFERENCE_COMMAND` rewrites it)."""
from __future__ import annotations

import dataclasses
import json
from typing import Any, List, Tuple

from glomo_pyg.settings import documentation

REFERENCE_COMMAND = ("python -c 'import glomo_pyg.training.reference as r; print(r.reference(), "
                     "end=\"\")' > docs/settings.md")


def _sections() -> List[Tuple[str, type, str]]:
    from glomo_pyg.nn.settings import IMAGE_DEFAULTS, TEXT_DEFAULTS, ModelSettings, saved_settings
    from glomo_pyg.training.image_classification import ImageTrainConfig
    from glomo_pyg.training.pretrain.config import CorpusConfig, TrainConfig
    from glomo_pyg.training.quickstart import QuickstartConfig

    image = ", ".join(f"`{f.name}` {_default(getattr(IMAGE_DEFAULTS, f.name))}"
                      for f in dataclasses.fields(ModelSettings)
                      if getattr(IMAGE_DEFAULTS, f.name) != getattr(TEXT_DEFAULTS, f.name))
    never, optional = saved_settings(which=(False,)), saved_settings(which=("optional",))
    return [
        ("`glomo pretrain`: `corpus`", CorpusConfig,
         "Where the documents (or images) come from and how they become training sequences."),
        ("`glomo pretrain`: `train`", TrainConfig, "Optimisation and the Lightning trainer."),
        ("Model settings: `glomo pretrain`'s `model`, saved predictors' `config.json`, the "
         "constructors", ModelSettings,
         "One rule per architecture setting, checked in the constructors, in `glomo "
         "pretrain`'s `model` section (the arguments of `Glomo.text` / `Glomo.image` and "
         "`layout`) and when a saved predictor is loaded (its emitter's arguments). The "
         "defaults are the text model's (`TEXT_DEFAULTS`); the image model's "
         f"(`IMAGE_DEFAULTS`) differ in {image}. A saved config holds every setting but "
         f"those of pretraining only ({', '.join(f'`{n}`' for n in never)}); "
         f"{' and '.join(f'`{n}`' for n in optional)} may be missing from files written "
         "before they existed, and mean their defaults. Each is declared once, in "
         "`ModelSettings` (`setting(..., saved=...)`): an emitter of one's own that adds a "
         "setting names a `ModelSettings` subclass declaring it as its `settings`, and "
         "saving and loading follow."),
        ("`glomo quickstart` (`QuickstartConfig`)", QuickstartConfig,
         "Its optimisation settings follow the rules of `train` above."),
        ("Image classification (`ImageTrainConfig`)", ImageTrainConfig,
         "The CIFAR-10 recipe of `train_image_classifier`."),
    ]


def _default(value: Any) -> str:
    if isinstance(value, dict):
        return "see the class"
    try:
        return f"`{json.dumps(value)}`"
    except TypeError:
        return f"`{value!r}`"


def reference() -> str:
    """``docs/settings.md``: every setting with its default, rule and meaning."""
    lines: List[str] = [
        "# Settings", "",
        "Every setting of glomo_pyg, with its default, what it may hold and what it does.",
        "Written by `glomo_pyg.training.reference.reference()` from the declarations in the "
        "code (each",
        "setting is declared once, as a dataclass field with its rule; see",
        "[design.md](design.md#settings)). A value that breaks its rule is refused with an",
        "error naming the dotted key, whether it comes from a YAML file, `--set`, a saved",
        "predictor or a constructor.", ""]
    for title, cls, intro in _sections():
        lines += [f"## {title}", "", intro, "", "| setting | default | allowed | meaning |",
                  "|---|---|---|---|"]
        for name, (default, allowed, doc) in documentation(cls).items():
            lines.append(f"| `{name}` | {_default(default)} | {allowed.replace('|', '/')} | "
                         f"{doc.replace('|', chr(92) + '|')} |")
        lines.append("")
    return "\n".join(lines)
