"""Reading .deb packages without dpkg: the ar reader, the data archive, and extraction that never leaves its
folder."""

from __future__ import annotations

from pathlib import Path

import pytest
from deb_fixtures import ar_archive, write_deb

from usmkit.data.corpora.common import RecipeError
from usmkit.data.corpora.debian import DebError, ar_members, extract_deb, package_root, safe_member_path


def test_ar_members_reads_odd_sizes_and_gnu_names():
    blob = ar_archive([("debian-binary", b"2.0\n"), ("odd", b"abc"), ("data.tar.xz", b"xyz!")])
    assert list(ar_members(blob, "x.deb")) == [("debian-binary", b"2.0\n"), ("odd", b"abc"), ("data.tar.xz", b"xyz!")]


@pytest.mark.parametrize(
    "blob, words",
    [
        (b"PK\x03\x04 not an ar", "not a .deb"),
        (ar_archive([("data.tar.xz", b"0123456789")])[:-4], "cut short"),
        (b"!<arch>\n" + b"x" * 30, "truncated or corrupt"),
    ],
)
def test_ar_members_refuses_bad_archives(blob, words):
    with pytest.raises(DebError, match=words):
        list(ar_members(blob, "bad.deb"))


@pytest.mark.parametrize("compression", ["xz", "gz", "zst"])
def test_extract_deb_writes_only_wanted_regular_files_inside_dest(tmp_path, compression):
    files = {"usr/share/a/one.wav": b"1", "usr/share/a/two.txt": b"2", "usr/share/doc/p/copyright": b"c"}
    deb = write_deb(tmp_path / "debs", "p", files, compression, links={"./usr/share/a/link.wav": "/etc/passwd"})
    dest = tmp_path / "out" / "p"
    written = extract_deb(deb, dest, want=lambda path: path.endswith(".wav") or path.endswith("copyright"))
    assert written == 2
    found = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file() or p.is_symlink())
    assert found == ["usr/share/a/one.wav", "usr/share/doc/p/copyright"]  # no link, no unwanted file


def test_extract_deb_skips_members_that_leave_the_folder(tmp_path):
    from deb_fixtures import tar_bytes

    data = tar_bytes({"../evil.wav": b"x", "/abs/evil.wav": b"x", "./usr/ok.wav": b"ok"}, "xz")
    deb = tmp_path / "evil_1_all.deb"
    deb.write_bytes(ar_archive([("debian-binary", b"2.0\n"), ("data.tar.xz", data)]))
    dest = tmp_path / "x" / "evil"
    assert extract_deb(deb, dest, want=lambda p: True) == 1
    assert (dest / "usr/ok.wav").read_bytes() == b"ok"
    assert not (tmp_path / "x" / "evil.wav").exists() and not Path("/abs/evil.wav").exists()
    assert safe_member_path("a/../../b") is None


def test_extract_deb_without_data_member(tmp_path):
    deb = tmp_path / "p_1_all.deb"
    deb.write_bytes(ar_archive([("debian-binary", b"2.0\n")]))
    with pytest.raises(DebError, match="no data.tar"):
        extract_deb(deb, tmp_path / "out", want=lambda p: True)


def test_package_root_prefers_the_deb_then_unpacked_folders(tmp_path):
    debs = tmp_path / "debs"
    write_deb(debs, "pkg-a", {"usr/a.txt": b"a"}, version="2.1-3")
    (debs / "pkg-b" / "usr").mkdir(parents=True)
    a = package_root(debs, "pkg-a", tmp_path / "out", want=lambda p: True)
    assert (a.root / "usr/a.txt").read_bytes() == b"a" and a.version == "2.1-3"
    b = package_root(debs, "pkg-b", tmp_path / "out", want=lambda p: True)
    assert b.root == debs / "pkg-b" and b.version == ""
    with pytest.raises(RecipeError, match="apt-get download pkg-c"):
        package_root(debs, "pkg-c", tmp_path / "out", want=lambda p: True)
    installed = tmp_path / "root"  # an installed system: debs=/
    (installed / "usr" / "share").mkdir(parents=True)
    assert package_root(installed, "pkg-c", tmp_path / "out", want=lambda p: True).root == installed
