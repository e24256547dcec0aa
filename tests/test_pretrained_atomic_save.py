"""save_pretrained over an existing predictor, killed at any point: the directory always
holds the complete previous or the complete new predictor, and the next save removes
what the killed one left behind.

The kill tests fork the test process (importing torch in a fresh interpreter costs
seconds per trial on a loaded machine) and SIGKILL the child at random times while it
saves two predictors over each other in a loop. GLOMO_RELIABILITY_LARGE=1 runs them
with ~100 MB predictors and many more trials.
"""
import os
import random
import re
import signal
import sys
import time
from collections import Counter

import pytest
import torch

import glomo_pyg.atomic_files as atomic_files
from glomo_pyg import (
    GraphPredictor,
    PretrainedFormatError,
    PretrainedGraphPredictor,
    load_pretrained,
    save_pretrained,
)

LARGE = os.environ.get("GLOMO_RELIABILITY_LARGE") == "1"
posix_only = pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "win32",
                                reason="needs fork and SIGKILL")


def predictor(num_tokens, hidden, seed):
    torch.manual_seed(seed)
    parts = {d: GraphPredictor(num_tokens=num_tokens, hidden_channels=hidden, num_layers=2,
                               heads=4, direction=d, cnn_layers=2)
             for d in ("forward", "backward")}
    return PretrainedGraphPredictor(parts["forward"], parts["backward"]).eval()


def which(loaded, candidates):
    """The name of the candidate whose weights ``loaded`` holds (None: neither)."""
    got = loaded.state_dict()
    for name, p in candidates.items():
        want = p.state_dict()
        if got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want):
            return name
    return None


def leftovers(path):
    return sorted(n for n in os.listdir(path.parent) if n.startswith(f".{path.name}.glomo-"))


def in_child(work):
    """Run ``work`` in a forked child that never returns into pytest; its pid."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover (child)
        try:
            torch.set_num_threads(1)
            work()
        finally:
            os._exit(0)
    return pid


def save_forever(path, a, b):
    def work():
        for k in range(10 ** 9):
            save_pretrained((b, a)[k % 2], path)
    return work


def kill_trials(tmp_path, trials, size, seed):
    a, b = predictor(size[0], size[1], 1), predictor(size[0], size[1], 2)
    path = tmp_path / "p"
    save_pretrained(b, path)
    start = time.perf_counter()
    save_pretrained(a, path)
    per_save = time.perf_counter() - start
    rng = random.Random(seed)
    outcomes = Counter()
    for _ in range(trials):
        pid = in_child(save_forever(path, a, b))
        time.sleep(rng.uniform(0, 3 * per_save))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        outcomes["kill left temporaries" if leftovers(path) else "kill left none"] += 1
        try:
            loaded = load_pretrained(path)
        except PretrainedFormatError as err:
            # killed between the two renames: the message names the backup and says what
            # to do; doing it gives the previous predictor
            backup = re.search(r"Rename (\S+) to ", str(err)).group(1)
            os.rename(backup, path)
            outcomes["missing, restored as the message says"] += 1
            loaded = load_pretrained(path)
        name = which(loaded, {"a": a, "b": b})
        assert name is not None, "a kill left a predictor that is neither the old nor the new"
        outcomes[f"loads {name}"] += 1
    save_pretrained(a, path)  # the next save removes what killed saves left
    assert leftovers(path) == [] and sorted(os.listdir(path)) == ["config.json",
                                                                   "model.safetensors"]
    print(f"\n{trials} SIGKILL trials ("
          f"{os.path.getsize(path / 'model.safetensors') / 1e6:.1f} MB, {per_save:.3f} s per "
          f"save): {dict(outcomes)}")
    return outcomes


@posix_only
def test_sigkill_at_random_times_never_loses_the_predictor(tmp_path):
    size = (50_000, 256) if LARGE else (2_000, 128)  # ~110 MB or ~4.2 MB of weights
    outcomes = kill_trials(tmp_path, 100 if LARGE else 12, size, seed=4321)
    assert outcomes["loads a"] + outcomes["loads b"] == (100 if LARGE else 12)


def die_at(point, path, new, old_rename=os.rename):
    """A child that saves ``new`` over ``path`` and dies (os._exit) at ``point``."""
    def work():
        if point == "writing":  # the first file written, before it is synced
            os.fsync = lambda fd: os._exit(0)
        elif point == "after the swap":  # before the backup is removed
            rmtree = atomic_files.shutil.rmtree
            atomic_files.shutil.rmtree = lambda p, **kw: (
                os._exit(0) if ".glomo-old-" in os.fspath(p) else rmtree(p, **kw))
        elif point == "between renames":
            def rename(src, dst):
                old_rename(src, dst)
                if os.fspath(src) == os.fspath(path):
                    os._exit(0)
            os.rename = rename
        save_pretrained(new, path)
    return work


@posix_only
@pytest.mark.parametrize("point", ["writing", "after the swap", "between renames"])
def test_death_at_each_step_of_a_save(tmp_path, point):
    old, new = predictor(30, 16, 1), predictor(30, 16, 2)
    path = tmp_path / "p"
    save_pretrained(old, path)
    os.waitpid(in_child(die_at(point, path, new)), 0)
    assert leftovers(path)  # the killed save left its temporaries
    if point == "between renames":
        assert not path.exists()
        with pytest.raises(PretrainedFormatError, match=r"p does not exist: a save_pretrained into "
                           r"it was interrupted .* the previous predictor is complete in \S+"
                           r"\.p\.glomo-old-\d+-[0-9a-f]{8}\. Rename"):
            load_pretrained(path)
        expected = "old"
    else:
        expected = "new" if point == "after the swap" else "old"
        assert which(load_pretrained(path), {"old": old, "new": new}) == expected
    third = predictor(30, 16, 3)
    save_pretrained(third, path)  # puts a backup back first, then saves; no leftovers
    assert leftovers(path) == [] and which(load_pretrained(path), {"third": third}) == "third"


def test_temporaries_of_a_running_save_are_kept(tmp_path):
    import fcntl
    path = tmp_path / "p"
    save_pretrained(predictor(30, 16, 1), path)
    staged = tmp_path / ".p.glomo-new-123-0123abcd"
    other = tmp_path / ".p.glomo-new-x-0123abcd"  # not a save's
    for d in (staged, other):
        d.mkdir()
    fd = os.open(tmp_path, os.O_RDONLY)
    try:  # a save running elsewhere holds the folder's lock: its staged folder is kept
        fcntl.flock(fd, fcntl.LOCK_EX)
        load_pretrained(path)
        assert staged.exists()
    finally:
        os.close(fd)  # (the OS drops the lock of a writer that dies)
    load_pretrained(path)
    assert not staged.exists() and other.exists()


def test_a_directory_with_other_content_is_not_replaced(tmp_path):
    path = tmp_path / "p"
    save_pretrained(predictor(30, 16, 1), path)
    (path / "README.md").write_text("mine")
    with pytest.raises(ValueError, match=r"holds \['README.md'\] besides a saved predictor"):
        save_pretrained(predictor(30, 16, 2), path)
    assert (path / "README.md").read_text() == "mine"
    os.remove(path / "README.md")
    # a temporary file of the former per-file save, killed, is dropped with the old files
    (path / ".model.safetensors.k2j4h1.tmp").write_bytes(b"x" * 100)
    save_pretrained(predictor(30, 16, 2), path)
    assert sorted(os.listdir(path)) == ["config.json", "model.safetensors"]


def test_an_empty_directory_or_a_link_to_one_keeps_its_place(tmp_path):
    target = tmp_path / "real"
    target.mkdir()
    os.chmod(target, 0o750)
    link = tmp_path / "link"
    link.symlink_to(target)
    first = predictor(30, 16, 1)
    save_pretrained(first, link)
    assert link.is_symlink() and sorted(os.listdir(target)) == ["config.json", "model.safetensors"]
    assert oct(os.stat(target).st_mode & 0o777) == oct(0o750)
    assert which(load_pretrained(link), {"first": first}) == "first"


def test_a_directory_that_cannot_be_swapped_is_written_in_place(tmp_path, monkeypatch):
    import errno
    path = tmp_path / "p"
    save_pretrained(predictor(30, 16, 1), path)

    def busy(new, target):
        raise OSError(errno.EBUSY, "Device or resource busy")
    monkeypatch.setattr(atomic_files, "_swap_in", busy)
    second = predictor(30, 16, 2)
    with pytest.warns(RuntimeWarning, match="cannot replace .* as a whole .*in place"):
        save_pretrained(second, path)
    assert sorted(os.listdir(path)) == ["config.json", "model.safetensors"]
    assert leftovers(path) == []
    assert which(load_pretrained(path), {"second": second}) == "second"


def test_save_into_the_working_directory(tmp_path, monkeypatch):
    path = tmp_path / "p"
    save_pretrained(predictor(30, 16, 1), path)
    monkeypatch.chdir(path)
    second = predictor(30, 16, 2)
    save_pretrained(second, ".")
    assert os.getcwd() == str(path.resolve()) and sorted(os.listdir(".")) == [
        "config.json", "model.safetensors"]
    assert which(load_pretrained("."), {"second": second}) == "second"
