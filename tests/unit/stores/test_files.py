"""remove_file: a vanished file counts as removed; other errors are returned, not raised."""

from __future__ import annotations

from pathlib import Path

from kvmux.stores._files import remove_file


def test_removes_a_file(tmp_path: Path) -> None:
    path = tmp_path / "entry"
    path.write_bytes(b"x")
    assert remove_file(path) is None
    assert not path.exists()


def test_a_vanished_file_counts_as_removed(tmp_path: Path) -> None:
    assert remove_file(tmp_path / "gone") is None


def test_an_error_is_returned(tmp_path: Path) -> None:
    directory = tmp_path / "a-directory"
    directory.mkdir()
    error = remove_file(directory)  # unlink refuses a directory
    assert isinstance(error, OSError)
    assert directory.is_dir()
