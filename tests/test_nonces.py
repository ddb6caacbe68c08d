"""The single-use nonce book that signed commands and OTA rollback requests share."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from edgeinfer.nonces import NonceBook, NonceRefused


def _refused(book: NonceBook, nonce: str, expires: float, now: float) -> str:
    with pytest.raises(NonceRefused) as err:
        book.take(nonce, expires, now=now)
    return err.value.reason


def test_a_nonce_is_taken_once_also_after_a_restart_until_it_expires(tmp_path: Path) -> None:
    path, now = tmp_path / "sub" / "nonces.json", time.time()
    book = NonceBook(path)
    book.take("aa" * 8, now + 100, now=now)
    assert _refused(book, "aa" * 8, now + 100, now) == "replayed"
    assert _refused(NonceBook(path), "aa" * 8, now + 100, now + 50) == "replayed"  # restarted
    NonceBook(path).take("aa" * 8, now + 300, now=now + 101)  # expired: forgotten, taken again
    assert set(json.loads(path.read_bytes())) == {"aa" * 8}
    assert path.stat().st_mode & 0o777 == 0o600


def test_a_full_book_refuses_new_nonces_and_forgets_none_early(tmp_path: Path) -> None:
    book, now = NonceBook(tmp_path / "n.json", max_nonces=2), time.time()
    book.take("1" * 16, now + 10, now=now)
    book.take("2" * 16, now + 20, now=now)
    assert _refused(book, "3" * 16, now + 30, now) == "full"
    assert "1" * 16 in book and "2" * 16 in book
    book.take("3" * 16, now + 30, now=now + 11)  # the first expired: room again


def test_an_unreadable_book_starts_afresh_and_says_so(tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "n.json"
    for text in ("{not json", "[1, 2]", '{"a": "soon"}'):
        path.write_text(text)
        NonceBook(path).take("ab" * 8, time.time() + 5)
        assert "starting afresh" in caplog.text
        caplog.clear()
