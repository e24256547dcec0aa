"""The seal of a saved predictor: one digest over everything ``config.json`` holds (the
emitters' settings, the vocabulary, the pixel statistics, the weights file's size and
SHA-256, so the weights too), checked on load. A seal is not a signature (anyone can
compute one): it makes every edit to a saved predictor deliberate. An edit breaks it, and
:func:`~glomo_pyg.io.pretrained.load_pretrained` then names the keys that differ, from
per-key digests kept beside the total; a bundle edited on purpose is sealed again with
:func:`~glomo_pyg.io.pretrained.reseal_pretrained` (``glomo reseal DIR``)."""
from __future__ import annotations

import hashlib
import json
from typing import Any, Dict, List, Optional

SEAL_KEY = "seal"


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False,
                      ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _parts(config: Dict[str, Any]) -> Dict[str, str]:
    """A digest per dotted key: each top-level entry, and each setting of each direction's
    emitter (so an error can say ``directions.forward.config.sparse``)."""
    out = {}
    for key, value in config.items():
        if key == SEAL_KEY:
            continue
        if key == "directions" and isinstance(value, dict):
            for direction, entry in value.items():
                if not isinstance(entry, dict):
                    out[f"directions.{direction}"] = _digest(entry)
                    continue
                for name, item in entry.items():
                    if name == "config" and isinstance(item, dict):
                        for setting, v in item.items():
                            out[f"directions.{direction}.config.{setting}"] = _digest(v)[:16]
                    else:
                        out[f"directions.{direction}.{name}"] = _digest(item)[:16]
        else:
            out[key] = _digest(value)[:16]
    return out


def seal_of(config: Dict[str, Any]) -> Dict[str, Any]:
    """The ``seal`` entry for ``config`` (whatever ``seal`` it holds is ignored)."""
    body = {k: v for k, v in config.items() if k != SEAL_KEY}
    return dict(sha256=_digest(body), keys=_parts(config))


def seal_problem(config: Dict[str, Any]) -> Optional[str]:
    """``None`` when ``config``'s seal matches it, else what is wrong, naming the keys
    that differ from what was sealed (or saying the seal itself is damaged)."""
    seal = config.get(SEAL_KEY)
    if not isinstance(seal, dict) or not isinstance(seal.get("sha256"), str) or \
            not isinstance(seal.get("keys"), dict):
        return "it has no valid seal (a 'seal' entry with 'sha256' and 'keys')"
    if seal_of(config)["sha256"] == seal["sha256"]:
        return None
    now, then = _parts(config), seal["keys"]
    changed: List[str] = sorted(k for k in now if k in then and then[k] != now[k])
    added = sorted(k for k in now if k not in then)
    removed = sorted(k for k in then if k not in now)
    said = []
    for words, keys in (("changed", changed), ("added", added), ("removed", removed)):
        if keys:
            said.append(f"{words}: {', '.join(keys[:8])}{' ...' if len(keys) > 8 else ''}")
    if not said:
        return "its seal was edited (the keys match their digests, the total does not)"
    return "it was edited after it was sealed (" + "; ".join(said) + ")"
