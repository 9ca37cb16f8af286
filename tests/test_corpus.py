"""Reading text: UTF-8, CRLF, empty lines, errors that name the file and line."""
import io
import sys

import pytest

from onmt_lite.corpus import InputError, lines_of, read_lines, read_parallel


def write(path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def test_read_lines_utf8(tmp_path):
    path = write(tmp_path / "x.txt", "ein mädchen .\n東京 ☃\n".encode("utf-8"))
    assert read_lines(path) == ["ein mädchen .", "東京 ☃"]


def test_read_lines_without_final_newline(tmp_path):
    path = write(tmp_path / "x.txt", b"a b\nc")
    assert read_lines(path) == ["a b", "c"]


def test_read_lines_crlf(tmp_path):
    path = write(tmp_path / "x.txt", b"a b\r\nc\r\n\r\nd\r\n")
    assert read_lines(path) == ["a b", "c", "", "d"]


def test_empty_lines_are_legal(tmp_path):
    path = write(tmp_path / "x.txt", b"\na\n\n\nb\n\n")
    assert read_lines(path) == ["", "a", "", "", "b", ""]
    assert read_lines(write(tmp_path / "empty.txt", b"")) == []
    assert read_lines(write(tmp_path / "one.txt", b"\n")) == [""]


def test_no_other_whitespace_is_stripped(tmp_path):
    path = write(tmp_path / "x.txt", b" a  b \t\n")
    assert read_lines(path) == [" a  b \t"]


def test_only_newline_ends_a_line(tmp_path):
    # str.splitlines() would also split at these: form feed, NEL, LINE SEPARATOR, lone CR
    text = "a\x0cb\x85c\u2028d\re\n"
    path = write(tmp_path / "x.txt", text.encode("utf-8"))
    assert read_lines(path) == ["a\x0cb\x85c\u2028d\re"]


def test_invalid_utf8_names_file_and_line(tmp_path):
    path = write(tmp_path / "x.txt", b"good\nalso good\nbad \xff byte\nfine\n")
    with pytest.raises(InputError) as err:
        read_lines(path)
    assert f"{path}:3: invalid UTF-8" in str(err.value)


def test_latin1_file_is_refused_on_its_first_bad_line(tmp_path):
    path = write(tmp_path / "latin1.txt", "ok\nmädchen\n".encode("latin-1"))
    with pytest.raises(InputError, match=r"latin1\.txt:2: invalid UTF-8"):
        read_lines(path)


def test_missing_file(tmp_path):
    path = str(tmp_path / "nope.txt")
    with pytest.raises(InputError) as err:
        read_lines(path)
    assert str(err.value).startswith(f"{path}: cannot read")
    assert "No such file" in str(err.value)


def test_input_error_is_a_value_error():
    assert issubclass(InputError, ValueError)


def test_dash_reads_standard_input(monkeypatch):
    stdin = io.TextIOWrapper(io.BytesIO("x y\nz\n".encode("utf-8")))
    monkeypatch.setattr(sys, "stdin", stdin)
    assert read_lines("-") == ["x y", "z"]


def test_read_parallel(tmp_path):
    src = write(tmp_path / "s.txt", b"a b\nc\n")
    tgt = write(tmp_path / "t.txt", b"A B\nC\n")
    assert read_parallel(src, tgt) == (["a b", "c"], ["A B", "C"])
    assert read_parallel(src, None) == (["a b", "c"], None)


def test_read_parallel_line_count_mismatch_names_both_files_and_counts(tmp_path):
    src = write(tmp_path / "s.txt", b"a\nb\nc\n")
    tgt = write(tmp_path / "t.txt", b"A\nB\n")
    with pytest.raises(InputError) as err:
        read_parallel(src, tgt)
    message = str(err.value)
    assert src in message and tgt in message
    assert "2 lines" in message and "has 3" in message


def test_lines_of_accepts_a_list_or_a_path(tmp_path):
    assert list(lines_of(["a", "b"])) == ["a", "b"]
    assert list(lines_of(write(tmp_path / "x.txt", b"a\n"))) == ["a"]


def test_the_progress_bar_knows_the_line_count_up_front(tmp_path):
    from onmt_lite.translate.batching import line_count as _line_count
    for text, lines in (("", 0), ("a\n", 1), ("a\nb", 2), ("a\n\n\nb\n", 4)):
        path = tmp_path / "f.txt"
        path.write_text(text, encoding="utf-8")
        assert _line_count(str(path)) == lines
    assert _line_count(["x", "y"]) == 2 and _line_count("-") is None
