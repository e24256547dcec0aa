"""The reference of every setting (``docs/settings.md``), written from the declarations
themselves: ``python -m glomo_pyg.training.settings_reference > docs/settings.md``
(tests/test_settings.py checks the committed file is current)."""
from __future__ import annotations

import json
from typing import Any, List

from glomo_pyg.nn.settings import ModelSettings
from glomo_pyg.settings import documentation
from glomo_pyg.training.image_classification import ImageTrainConfig
from glomo_pyg.training.pretrain.config import CorpusConfig, TrainConfig
from glomo_pyg.training.quickstart import QuickstartConfig

SECTIONS = [
    ("`glomo pretrain`: `corpus`", CorpusConfig,
     "Where the documents (or images) come from and how they become training sequences."),
    ("`glomo pretrain`: `train`", TrainConfig, "Optimisation and the Lightning trainer."),
    ("Model settings: `glomo pretrain`'s `model`, saved predictors' `config.json`, the "
     "constructors", ModelSettings,
     "One rule per architecture setting, checked in the constructors, in `glomo pretrain`'s "
     "`model` section (the arguments of `Glomo.text` / `Glomo.image` and `layout`) and "
     "when a saved predictor is loaded (its emitter's arguments). Defaults are "
     "`Glomo.text`'s; `Glomo.image` and the emitters document their own."),
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
    lines: List[str] = [
        "# Settings", "",
        "Every setting of glomo_pyg, with its default, what it may hold and what it does.",
        "Written by `python -m glomo_pyg.training.settings_reference` from the declarations",
        "in the code (each setting is declared once, as a dataclass field with its rule; see",
        "[design.md](design.md#settings)). A value that breaks its rule is refused with an",
        "error naming the dotted key, whether it comes from a YAML file, `--set`, a saved",
        "predictor or a constructor.", ""]
    for title, cls, intro in SECTIONS:
        lines += [f"## {title}", "", intro, "", "| setting | default | allowed | meaning |",
                  "|---|---|---|---|"]
        for name, (default, allowed, doc) in documentation(cls).items():
            cell = doc.replace("|", "\\|")
            lines.append(f"| `{name}` | {_default(default)} | {allowed.replace('|', '/')} | "
                         f"{cell} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    print(reference(), end="")


if __name__ == "__main__":
    main()
