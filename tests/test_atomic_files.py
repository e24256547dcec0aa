"""Atomic file writes: the target holds the old file or the whole new one, never a part."""
import os
import stat

import pytest

from glomo_pyg.atomic_files import atomic_write, umask


def _temporaries(folder):
    return [n for n in os.listdir(folder) if n.endswith(".tmp")]


def test_writes_text_and_bytes_and_replaces_an_existing_file(tmp_path):
    path = tmp_path / "sub" / "scores.json"  # missing folders are created
    with atomic_write(path) as fh:
        fh.write("héllo")
    assert path.read_text(encoding="utf-8") == "héllo"
    with atomic_write(str(path), "wb") as fh:
        fh.write(b"\x00\x01")
    assert path.read_bytes() == b"\x00\x01"
    assert _temporaries(path.parent) == []


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "vocabulary.json"
    path.write_text("old")
    with pytest.raises(RuntimeError, match="mid-write"):
        with atomic_write(path) as fh:
            fh.write("half of the new")
            raise RuntimeError("mid-write")
    assert path.read_text() == "old" and _temporaries(tmp_path) == []
    with pytest.raises(KeyboardInterrupt):  # an interrupt too
        with atomic_write(tmp_path / "new.json") as fh:
            raise KeyboardInterrupt
    assert not (tmp_path / "new.json").exists() and _temporaries(tmp_path) == []


def test_permissions_follow_the_umask_like_open(tmp_path):
    with atomic_write(tmp_path / "a") as fh:
        fh.write("x")
    with open(tmp_path / "b", "w") as fh:
        fh.write("x")
    mode = stat.S_IMODE(os.stat(tmp_path / "a").st_mode)
    assert mode == stat.S_IMODE(os.stat(tmp_path / "b").st_mode) == 0o666 & ~umask()


def test_a_link_at_the_target_is_replaced_not_followed(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "graphs.json").symlink_to(outside)
    with atomic_write(folder / "graphs.json") as fh:
        fh.write("new")
    assert outside.read_text() == "keep me"
    assert not (folder / "graphs.json").is_symlink()
    assert (folder / "graphs.json").read_text() == "new"


def test_bad_mode_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError, match="mode must be 'w' or 'wb'"):
        with atomic_write(tmp_path / "x", "a"):
            pass
    assert list(tmp_path.iterdir()) == []
