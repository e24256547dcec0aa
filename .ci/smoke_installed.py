"""Smoke test of an installed glomo_pyg, run as a user would: from a folder outside the
source tree, with the package imported from site-packages (never from the checkout).

    python .ci/smoke_installed.py --checkout PATH [--wheel WHEEL] [--same-as WHEEL]
                                  [--work DIR] [--quick]

``--checkout`` is the source tree the package was built from: its releases are compared
with the installed ones (same files, same graphs) and its README's python blocks run.
``--wheel`` also checks what the wheel holds (and ``--same-as``, that another build of it
holds the same files, byte for byte); ``--quick`` stops after the releases (no viewer,
quickstart or README). Prints one line per check; exits non-zero
on the first failure.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from importlib import metadata
from pathlib import Path
from typing import List

# a wheel carries the package (its releases included), its metadata and the CLI entry
# module pyproject.toml names, and nothing else:
# no tests, data, checkpoints, caches or hidden files
STRAY = re.compile(r"__pycache__|\.py[cod]$|\.ckpt$|\.npy$|\.npz$|\.pkl$|(^|/)\.")


def step(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def glomo(*args: str) -> str:
    """Run the installed ``glomo`` executable; its output (a failure stops the smoke)."""
    exe = shutil.which("glomo")
    if exe is None:
        sys.exit("the glomo executable is not on PATH")
    proc = subprocess.run([exe, *args], capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0:
        sys.exit(f"glomo {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    return proc.stdout


def check_installed(checkout: Path) -> None:
    import glomo_pyg

    where = Path(glomo_pyg.__file__).resolve()
    if checkout in where.parents or Path.cwd().resolve() in where.parents:
        sys.exit(f"glomo_pyg was imported from {where}, not from the installed package")
    version = metadata.version("glomo-pyg")
    if glomo_pyg.__version__ != version:
        sys.exit(f"glomo_pyg.__version__ {glomo_pyg.__version__} != installed {version}")
    shown = glomo("--version").strip()
    if shown != f"glomo_pyg {version}":
        sys.exit(f"glomo --version printed {shown!r}")
    step(f"import glomo_pyg {version} from {where.parent}; glomo --version: {shown}")


def same_wheels(wheel: Path, other: Path) -> None:
    """The two wheels list the same files with the same digests (their RECORDs)."""
    records = []
    for path in (wheel, other):
        with zipfile.ZipFile(path) as zf:
            record = next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
            records.append(sorted(zf.read(record).decode().splitlines()))
    if records[0] != records[1]:
        diff = sorted(set(records[0]) ^ set(records[1]))
        sys.exit(f"{wheel} and {other} differ: {diff[:10]}")
    step(f"{wheel.name} built from the sdist = the wheel built from the tree "
         f"({len(records[0])} files, same digests)")


def check_wheel(wheel: Path, checkout: Path) -> None:
    from glomo_pyg.io.releases import RELEASE_FILES

    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        top = ("glomo_pyg/", f"glomo_pyg-{metadata.version('glomo-pyg')}.dist-info/")
        modules = {f"{m}.py" for m in top_level_modules(checkout)}
        stray = [n for n in names
                 if not (n.startswith(top) or n in modules) or STRAY.search(n)]
        if stray:
            sys.exit(f"{wheel.name} holds files a wheel must not: {stray[:10]}")
        if "glomo_pyg/py.typed" not in names:  # (PEP 561: else type checkers skip us)
            sys.exit(f"{wheel.name} lacks glomo_pyg/py.typed")
        for release in checkout_releases(checkout):
            for file in RELEASE_FILES:
                inside = f"glomo_pyg/pretrained/{release}/{file}"
                if inside not in names or zf.read(inside) != \
                        (checkout / "pretrained" / release / file).read_bytes():
                    sys.exit(f"{wheel.name}: {inside} is missing or differs from the checkout")
    step(f"{wheel.name}: {len(names)} files, {wheel.stat().st_size / 2**20:.2f} MiB, "
         "no tests, data or caches; py.typed; every release byte for byte")


def top_level_modules(checkout: Path) -> List[str]:
    """The single-file modules pyproject.toml installs beside the package (the CLI's entry)."""
    # (a regex rather than tomllib, which Python 3.10 lacks)
    found = re.search(r"^py-modules\s*=\s*\[([^\]]*)\]",
                      (checkout / "pyproject.toml").read_text(), re.M)
    return re.findall(r'"([^"]+)"', found.group(1)) if found else []


def checkout_releases(checkout: Path) -> List[str]:
    root = checkout / "pretrained"
    return sorted(p.name for p in root.iterdir() if (p / "config.json").is_file())


def sample_graphs(predictor, modality: str, units):
    """Graphs of a fixed input: two sentences, or two seeded random images."""
    import torch

    from glomo_pyg.data import tokenize
    from glomo_pyg.pixels import image_units

    if modality == "text":
        texts = ["The story made no sense to me.", "A fine film, and a long one."]
        ids = [predictor.encode(tokenize(t), unknown="<unk>") for t in texts]
        batch = torch.cat([torch.full((len(x),), i) for i, x in enumerate(ids)])
        return predictor(torch.cat(ids), batch)
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (2, 3, *units), generator=generator, dtype=torch.uint8)
    return predictor(*image_units(images))


def check_releases(checkout: Path) -> None:
    """Every release of the checkout is listed, loads by name from the installed package,
    holds the same bytes and gives exactly the graphs the checkout's copy gives."""
    import torch

    from glomo_pyg import PretrainedGraphPredictor
    from glomo_pyg.io.releases import RELEASE_FILES
    from glomo_pyg.publish import describe_release

    listing = glomo("pretrained")
    if "installed with the glomo_pyg package" not in listing:
        sys.exit(f"glomo pretrained does not list the installed releases:\n{listing}")
    for name in checkout_releases(checkout):
        info = describe_release(name)
        if name not in listing or checkout in Path(info["path"]).resolve().parents:
            sys.exit(f"release {name}: not listed, or found in the checkout ({info['path']})")
        for file in RELEASE_FILES:
            a, b = Path(info["path"]) / file, checkout / "pretrained" / name / file
            if a.read_bytes() != b.read_bytes():
                sys.exit(f"release {name}: {file} differs from the checkout's")
        installed = PretrainedGraphPredictor.from_pretrained(name)
        source = PretrainedGraphPredictor.from_pretrained(checkout / "pretrained" / name)
        with torch.no_grad():
            ours, theirs = (sample_graphs(p, info["modality"], info["units"])
                            for p in (installed, source))
        for direction in installed.directions:
            a, b = getattr(ours, direction), getattr(theirs, direction)
            if not torch.equal(a.to_dense(), b.to_dense()):
                sys.exit(f"release {name}: {direction} graphs differ from the checkout's")
        step(f"release {name} ({info['modality']}): loaded by name from {info['path']}; "
             "same files and same graphs as the checkout's")


def check_view() -> None:
    import numpy as np
    from PIL import Image

    glomo("view", "--predictor", "imdb-text-cpu", "--text", "The story made no sense to me.",
          "--output", "text.html")
    pixels = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    Image.fromarray(pixels).save("image.png")
    glomo("view", "--predictor", "imagenet32-pixel-cpu", "--image", "image.png",
          "--output", "image.html")
    for page in ("text.html", "image.html"):
        if os.path.getsize(page) < 10_000:
            sys.exit(f"glomo view wrote a {os.path.getsize(page)}-byte {page}")
    step("glomo view: a text and an image page written")


def readme_snippets(readme: str) -> List[str]:
    """Every python block of the README, in order."""
    return re.findall(r"^```python\n(.*?)^```", readme, re.MULTILINE | re.DOTALL)


def check_readme(checkout: Path) -> None:
    """Every python block of the README runs as printed, in an empty folder (before the
    quickstart: a block may use what the package ships, not what a run wrote)."""
    blocks = readme_snippets((checkout / "README.md").read_text(encoding="utf-8"))
    if len(blocks) < 6:
        sys.exit(f"found only {len(blocks)} python blocks in the README")
    here = Path.cwd()
    os.chdir(tempfile.mkdtemp(prefix="readme-", dir=here))
    try:
        for i, code in enumerate(blocks):
            exec(compile(code, f"README.md python block {i + 1}", "exec"),
                 {"__name__": "__main__"})
    finally:
        os.chdir(here)
    step(f"README: all {len(blocks)} python blocks ran, in an empty folder")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", required=True, type=Path)
    parser.add_argument("--wheel", type=Path)
    parser.add_argument("--same-as", type=Path, help="another build of the wheel")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--work", type=Path, help="an empty folder to run in (default: a "
                        "temporary one)")
    args = parser.parse_args()
    checkout = args.checkout.resolve()
    work = Path(args.work or tempfile.mkdtemp(prefix="glomo-smoke-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    os.chdir(work)
    sys.path[:] = [p for p in sys.path if p not in ("", ".", str(checkout))]
    start = time.time()
    if args.wheel:
        check_wheel(args.wheel.resolve(), checkout)
        if args.same_as:
            same_wheels(args.wheel.resolve(), args.same_as.resolve())
    check_installed(checkout)
    check_releases(checkout)
    if args.quick:
        step(f"quick smoke test passed in {time.time() - start:.0f} s")
        return
    check_view()
    check_readme(checkout)
    glomo("quickstart", "--steps", "20", "--batch-size", "8", "--threads", "2",
          "--no-progress")  # (writes runs/quickstart/predictor, which examples/ loads)
    step("glomo quickstart: 20 steps, predictor saved")
    step(f"smoke test of the installed package passed in {time.time() - start:.0f} s "
         f"(in {work})")


if __name__ == "__main__":
    main()
