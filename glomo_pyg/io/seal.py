"""The seal of a saved predictor: a SHA-256 digest of its whole ``config.json`` (the
weights' digest included), and per-key digests that name what an edit changed."""
from __future__ import annotations

from typing import Any, Dict, Optional

from glomo_pyg.digests import canonical_digest

SEAL_KEY = "seal"
_NESTED = ("directions", "*", "config")  # the keys digested entry by entry, level by level


def _parts(config: Dict[str, Any], prefix: str = "", depth: int = 0) -> Dict[str, str]:
    """A digest per dotted key, down to each emitter setting, so an error can name it."""
    out = {}
    for key, value in config.items():
        if depth == 0 and key == SEAL_KEY:
            continue
        if isinstance(value, dict) and depth < len(_NESTED) and _NESTED[depth] in (key, "*"):
            out.update(_parts(value, f"{prefix}{key}.", depth + 1))
        else:
            out[prefix + key] = canonical_digest(value)[:16]
    return out


def seal_of(config: Dict[str, Any]) -> Dict[str, Any]:
    """The ``seal`` entry for ``config`` (whatever ``seal`` it holds is ignored)."""
    body = {k: v for k, v in config.items() if k != SEAL_KEY}
    return dict(sha256=canonical_digest(body), keys=_parts(config))


def seal_problem(config: Dict[str, Any]) -> Optional[str]:
    """``None`` when ``config``'s seal matches it, else what is wrong, naming the keys
    that differ from what was sealed."""
    seal = config.get(SEAL_KEY)
    if not isinstance(seal, dict) or not isinstance(seal.get("sha256"), str) or \
            not isinstance(seal.get("keys"), dict):
        return "it has no valid seal (a 'seal' entry with 'sha256' and 'keys')"
    if seal_of(config)["sha256"] == seal["sha256"]:
        return None
    now, then = _parts(config), seal["keys"]
    said = [f"{words}: {', '.join(keys[:8])}{' ...' if len(keys) > 8 else ''}"
            for words, keys in (
                ("changed", sorted(k for k in now if k in then and then[k] != now[k])),
                ("added", sorted(k for k in now if k not in then)),
                ("removed", sorted(k for k in then if k not in now))) if keys]
    if not said:
        return "its seal was edited (the keys match their digests, the total does not)"
    return "it was edited after it was sealed (" + "; ".join(said) + ")"
