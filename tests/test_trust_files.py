"""Files a predictor or a run is read from are trusted only as far as checked: seals
cannot be stepped around (a lowered format version, a release named by path), reads are
bounded (sized from stat before reading, hashed in chunks), only regular files are
opened (a FIFO never hangs), killed saves leave nothing that lasts, and an output
folder is locked while a run writes into it."""
import json
import os
import subprocess
import sys
import time
import tracemalloc
import warnings

import pytest

from glomo_pyg import (
    PretrainedFormatError,
    PretrainedGraphPredictor,
    load_pretrained,
    save_pretrained,
)
from glomo_pyg.cli import main
from glomo_pyg.io import pretrained as io
from glomo_pyg.io.paths import FolderLockedError, NotRegularFileError, locked_folder, open_regular
from glomo_pyg.io.pretrained import UnsealedPredictorWarning
from glomo_pyg.publish import reseal_pretrained
from glomo_pyg.training.checkpoints import CheckpointError, read_checkpoint
from glomo_pyg.training.pretrain.corpus import read_json
from tests.test_pretrained_seal import text_predictor  # noqa: E402

FIFO = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")




def lowered(path, version):
    """A sealed folder edited (another vocabulary) with its version lowered, so that the
    seal would no longer be checked."""
    config = json.loads((path / "config.json").read_text())
    config["format_version"] = version
    config["vocabulary"] = [f"v{i}" for i in range(12)]
    (path / "config.json").write_text(json.dumps(config))
    return path


# --- 1. seals that cannot be stepped around ----------------------------------------------
@pytest.mark.parametrize("version", [1, 2])
def test_a_lowered_format_version_is_refused_unless_asked_for(tmp_path, version):
    path = lowered(text_predictor(tmp_path / "p"), version)
    with pytest.raises(PretrainedFormatError, match=f"format version {version}, which is not "
                                                    "sealed.*glomo reseal"):
        load_pretrained(path)
    with pytest.raises(PretrainedFormatError, match="not sealed"):
        PretrainedGraphPredictor.from_pretrained(path)
    if version == 2:
        with pytest.warns(UnsealedPredictorWarning):
            assert load_pretrained(path, allow_unsealed=True).vocabulary[0] == "v0"


def test_a_release_named_by_any_path_must_pass_its_seal(tmp_path, monkeypatch):
    root = tmp_path / "releases"
    lowered(text_predictor(root / "tiny-text"), 2)
    monkeypatch.setenv("GLOMO_PRETRAINED_DIR", str(root))
    (tmp_path / "link").symlink_to(root / "tiny-text", target_is_directory=True)
    (tmp_path / "rootlink").symlink_to(root, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    for name in ("tiny-text", str(root / "tiny-text"), "releases/tiny-text",
                 "./releases/../releases/tiny-text", "link", "rootlink/tiny-text"):
        with pytest.raises(PretrainedFormatError, match="a released predictor must always "
                                                        "be sealed"):
            load_pretrained(name, allow_unsealed=True)


def test_reseal_migrates_format_2_and_format_1(tmp_path):
    path = text_predictor(tmp_path / "p")
    config = json.loads((path / "config.json").read_text())
    config.pop("seal")
    config["format_version"] = 2
    (path / "config.json").write_text(json.dumps(config))
    reseal_pretrained(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_pretrained(path)
    from test_emitters import v1_directory

    v1 = v1_directory("pretrained-v1", tmp_path)
    with pytest.raises(PretrainedFormatError, match="format version 1"):
        load_pretrained(v1)
    assert main(["reseal", str(v1)]) == 0
    with open(os.path.join(v1, "config.json")) as fh:
        assert json.load(fh)["format_version"] == io.FORMAT_VERSION
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_pretrained(v1)


# --- 2. bounded reads ----------------------------------------------------------------------
def sparse_weights(path, size):
    with open(path / "model.safetensors", "r+b") as fh:
        fh.truncate(size)  # (sparse: no disk, no memory)


def test_reseal_and_load_refuse_a_huge_weights_file_by_its_size(tmp_path):
    path = text_predictor(tmp_path / "p")
    sparse_weights(path, 16 << 30)
    before = (path / "config.json").read_bytes()
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(PretrainedFormatError, match="more than the .* a predictor's "
                                                        "weights may have"):
            reseal_pretrained(path)
        with pytest.raises(PretrainedFormatError, match="more than the"):
            load_pretrained(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak
    assert time.perf_counter() - start < 10  # refused by stat, not read
    assert (path / "config.json").read_bytes() == before
    with pytest.raises(SystemExit, match="glomo reseal: .*more than the"):
        main(["reseal", str(path)])


def test_a_release_is_held_to_the_releases_weights_bound(tmp_path, monkeypatch):
    from glomo_pyg.io import releases

    root = tmp_path / "releases"
    text_predictor(root / "tiny-text")
    monkeypatch.setenv("GLOMO_PRETRAINED_DIR", str(root))
    load_pretrained("tiny-text")
    monkeypatch.setattr(releases, "MAX_WEIGHTS_BYTES", 1000)
    with pytest.raises(PretrainedFormatError, match="a released predictor's weights may have"):
        load_pretrained("tiny-text")


def test_reseal_hashes_in_chunks(tmp_path, monkeypatch):
    path = text_predictor(tmp_path / "p")
    monkeypatch.setattr(io, "MAX_WEIGHTS_BYTES", 1 << 30)
    sparse_weights(path, 256 << 20)  # under the bound: hashed, then refused by the load
    before = (path / "config.json").read_bytes()
    tracemalloc.start()
    try:
        with pytest.raises(PretrainedFormatError, match="safetensors"):
            reseal_pretrained(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20, peak  # a whole read would take 256 MiB
    assert (path / "config.json").read_bytes() == before  # put back


# --- 3. only regular files, never blocking -------------------------------------------------
def run_briefly(function, *args, **kwargs):
    """``function(*args)`` must return or raise within seconds (a FIFO read would hang):
    the alarm turns a hang into a failure."""
    import signal

    def hang(*_):
        raise AssertionError("the read blocked")

    old = signal.signal(signal.SIGALRM, hang)
    signal.alarm(10)
    try:
        return function(*args, **kwargs)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@FIFO
@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_a_fifo_in_a_predictor_is_refused_at_once(tmp_path, name):
    path = text_predictor(tmp_path / "p")
    os.unlink(path / name)
    os.mkfifo(path / name)
    for function in (load_pretrained, reseal_pretrained):
        with pytest.raises(PretrainedFormatError,
                           match=f"{name} cannot be read: .*not a regular file"):
            run_briefly(function, path)


@FIFO
def test_a_fifo_checkpoint_or_run_file_is_refused_at_once(tmp_path):
    os.mkfifo(tmp_path / "last.ckpt")
    with pytest.raises(CheckpointError, match="is a FIFO, not a regular file"):
        run_briefly(read_checkpoint, str(tmp_path / "last.ckpt"))
    os.mkfifo(tmp_path / "corpus.json")
    with pytest.raises(NotRegularFileError, match="FIFO"):
        run_briefly(read_json, str(tmp_path / "corpus.json"), "delete it")


@FIFO
def test_glomo_pretrain_refuses_a_fifo_corpus_at_once(tmp_path):
    from glomo_pyg.training import PretrainConfig, run_pretraining

    os.mkfifo(tmp_path / "corpus.txt")
    config = PretrainConfig.from_dict(dict(output_dir=str(tmp_path / "out"),
                                           corpus=dict(path=str(tmp_path / "corpus.txt"))))
    with pytest.raises(NotRegularFileError, match="corpus.path .* is a FIFO"):
        run_briefly(run_pretraining, config)
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_open_regular_refuses_devices_and_folders(tmp_path):
    for path in ("/dev/zero", str(tmp_path)):
        if os.path.exists(path):
            with pytest.raises(NotRegularFileError, match="not a regular file"):
                open_regular(path)
    (tmp_path / "f").write_bytes(b"x")
    fd = open_regular(tmp_path / "f")
    try:
        assert os.read(fd, 4) == b"x"
    finally:
        os.close(fd)


# --- 4. interrupted saves leave nothing that lasts -----------------------------------------
@pytest.mark.parametrize("then", ["load", "save"])
def test_a_killed_saves_staging_folder_is_removed(tmp_path, then):
    path = text_predictor(tmp_path / "p")
    stale = tmp_path / ".p.glomo-new-123-0123abcd"  # no writer holds the folder's lock
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half written")
    if then == "load":
        load_pretrained(path)
    else:
        save_pretrained(load_pretrained(path), path)
    assert not stale.exists()


# --- 6. an output folder is locked while a run writes into it ------------------------------
def test_a_locked_folder_refuses_a_second_holder(tmp_path):
    with locked_folder(tmp_path / "run"):
        with pytest.raises(FolderLockedError, match="another run is writing into it"):
            with locked_folder(tmp_path / "run"):
                pass
        code = ("import sys; from glomo_pyg.io.paths import locked_folder\n"
                "try:\n    with locked_folder(sys.argv[1]): pass\n"
                "except OSError as err:\n    print(type(err).__name__, err); sys.exit(3)\n")
        other = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run")],
                               capture_output=True, text=True, timeout=120)
        assert other.returncode == 3 and "FolderLockedError" in other.stdout, other
    with locked_folder(tmp_path / "run"):  # released at the end of the block
        pass


def test_a_crashed_holder_frees_the_lock(tmp_path):
    code = ("import os, sys; from glomo_pyg.io.paths import locked_folder\n"
            "with locked_folder(sys.argv[1]):\n    print('held', flush=True); os._exit(1)\n")
    crashed = subprocess.run([sys.executable, "-c", code, str(tmp_path)],
                             capture_output=True, text=True, timeout=120)
    assert "held" in crashed.stdout
    with locked_folder(tmp_path):
        pass


def test_glomo_pretrain_refuses_a_locked_output_folder(tmp_path):
    from glomo_pyg.training import PretrainConfig, run_pretraining

    config = PretrainConfig.from_dict(dict(output_dir=str(tmp_path / "out"),
                                           corpus=dict(path=str(tmp_path / "none"))))
    with locked_folder(tmp_path / "out"):
        with pytest.raises(FolderLockedError, match="another glomo pretrain run is writing"):
            run_pretraining(config)


def test_a_fifo_corpus_is_refused_by_the_reader_itself(tmp_path):
    from glomo_pyg.data.text import read_text_documents
    from glomo_pyg.io.paths import NotRegularFileError

    fifo = tmp_path / "corpus.txt"
    os.mkfifo(fifo)
    with pytest.raises(NotRegularFileError, match="corpus.txt is a FIFO, not a regular file"):
        next(read_text_documents(str(fifo)))
