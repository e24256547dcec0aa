"""Editing saved predictors in tests the way an attacker could: write a config and seal
it again (the seal is a digest anyone can compute, so the loader's deeper checks must
hold on their own), or write it unsealed to test the seal itself."""
import json

from glomo_pyg.io.seal import seal_of


def write_config(path, config, seal=True):
    """Write ``config`` as ``path/config.json``, resealed unless ``seal`` is False."""
    if seal and isinstance(config, dict) and "seal" in config:
        config = dict(config, seal=seal_of(config))
    (path / "config.json").write_text(json.dumps(config))


def edit_config(path, change, seal=True):
    config = json.loads((path / "config.json").read_text())
    change(config)
    write_config(path, config, seal)
