"""Build hooks pyproject.toml cannot express: the wheel carries the released predictors
(``pretrained/NAME/`` -> ``glomo_pyg/pretrained/NAME/``, docs/pretrained.md says why),
and the README's relative links become absolute for the package index."""
import re
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
RELEASE_FILES = ("README.md", "config.json", "model.safetensors")
# where the repository is published; the README's relative links point into it
REPOSITORY = "https://github.com/glomo-pyg/glomo-pyg"


def version() -> str:
    text = (HERE / "glomo_pyg" / "version.py").read_text(encoding="utf-8")
    return re.search(r'^__version__ = "([^"]+)"$', text, re.MULTILINE).group(1)


def long_description() -> str:
    """README.md with every relative link and image made absolute (a tagged tree)."""
    tree = f"{REPOSITORY}/blob/v{version()}/"
    raw = f"{REPOSITORY}/raw/v{version()}/"

    def absolute(match: re.Match) -> str:
        bang, text, target = match.groups()
        if re.match(r"[a-z][a-z0-9+.-]*:|#", target):  # a URL or an anchor
            return match.group(0)
        return f"{bang}[{text}]({raw if bang else tree}{target})"

    readme = (HERE / "README.md").read_text(encoding="utf-8")
    return re.sub(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)", absolute, readme)


class BuildWithReleases(build_py):
    """build_py, plus the release folders (their three files each) as package data."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:  # (a checkout finds pretrained/ beside the package)
            return
        for folder in sorted((HERE / "pretrained").glob("*/")):
            if not (folder / "config.json").is_file():
                continue
            target = Path(self.build_lib) / "glomo_pyg" / "pretrained" / folder.name
            target.mkdir(parents=True, exist_ok=True)
            for name in RELEASE_FILES:
                shutil.copyfile(folder / name, target / name)


setup(long_description=long_description(), long_description_content_type="text/markdown",
      cmdclass={"build_py": BuildWithReleases})
