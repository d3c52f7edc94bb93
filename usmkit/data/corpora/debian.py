"""Debian packages as corpus sources: a ``.deb`` file, or the folder it was unpacked to.

A ``.deb`` is an ``ar`` archive holding ``debian-binary``, ``control.tar.*`` and ``data.tar.{xz,gz,zst}``;
the package's files are in ``data.tar``. Python's ``tarfile`` reads xz and gz, and the ``zstandard`` package
zst (Ubuntu's default); the standard library has no ``ar`` reader, so ``ar_members`` is our own (the format is
a magic line and 60-byte member headers, ``man 5 ar``).

A recipe asks for a package by name in a folder ``debs`` (``apt-get download NAME`` writes
``NAME_VERSION_ARCH.deb``)::

    root = package_root(debs, "asterisk-core-sounds-en-wav", dest, want=lambda p: p.endswith(".wav"))
    root / "usr/share/asterisk/sounds/..."   # the wanted files, under dest/NAME/

and gets the folder that holds the package's tree: the wanted members of the ``.deb`` extracted to
``dest/NAME/`` (regular files only; members with absolute paths or ``..`` and links are never written), or
``debs/NAME/`` when it is an unpacked package (``dpkg-deb -x NAME_*.deb debs/NAME``), or ``debs`` itself when it
holds ``usr/`` (an installed system: ``debs=/``).
"""

from __future__ import annotations

import io
import lzma
import shutil
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from usmkit.data.corpora.common import RecipeError

AR_MAGIC = b"!<arch>\n"
AR_HEADER = 60  # name 16, mtime 12, uid 6, gid 6, mode 8, size 10, "`\n" 2


class DebError(RecipeError):
    """A ``.deb`` that cannot be read; the message names the file."""


def ar_members(data: bytes, where: str) -> Iterator[tuple[str, bytes]]:
    """``(name, content)`` of each member of an ``ar`` archive (System V / GNU names: a trailing ``/`` dropped).

    >>> list(ar_members(b"!<arch>\\n" + b"a.txt/".ljust(48) + b"3".ljust(10) + b"`\\nhi\\n\\n", "x.deb"))
    [('a.txt', b'hi\\n')]
    """
    if not data.startswith(AR_MAGIC):
        raise DebError(f"{where}: not a .deb (no ar archive header); download it again with apt-get download")
    pos = len(AR_MAGIC)
    while pos < len(data):
        header = data[pos : pos + AR_HEADER]
        if len(header) < AR_HEADER or header[58:60] != b"`\n":
            raise DebError(f"{where}: truncated or corrupt ar member header at byte {pos}; download it again")
        name = header[:16].decode("ascii", "replace").strip().rstrip("/")
        try:
            size = int(header[48:58].decode("ascii").strip())
        except ValueError:
            raise DebError(f"{where}: bad ar member size at byte {pos}; download it again") from None
        start = pos + AR_HEADER
        if start + size > len(data):
            raise DebError(f"{where}: member {name!r} is cut short ({size} bytes announced); download it again")
        yield name, data[start : start + size]
        pos = start + size + (size % 2)  # members start on even offsets


def _open_data_tar(name: str, blob: bytes, where: str) -> tarfile.TarFile:
    if name.endswith(".zst"):
        try:
            import zstandard
        except ImportError:
            raise DebError(
                f"{where}: its data is zstd-compressed; pip install zstandard, or unpack it with "
                f"`dpkg-deb -x {Path(where).name} DEBS/PACKAGE` and pass that folder's parent as debs="
            ) from None
        blob = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(blob)).read()
    elif name.endswith(".xz"):
        blob = lzma.decompress(blob)
    try:
        return tarfile.open(fileobj=io.BytesIO(blob), mode="r:*")
    except tarfile.TarError as e:
        raise DebError(f"{where}: {name} is not a readable tar archive ({e}); download it again") from None


def safe_member_path(name: str) -> PurePosixPath | None:
    """The member's path relative to the package root, or None for one that would land outside it
    (absolute, or holding ``..``).

    >>> safe_member_path("./usr/share/a.wav"), safe_member_path("../etc/passwd"), safe_member_path("/etc/x")
    (PurePosixPath('usr/share/a.wav'), None, None)
    """
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts:
        return None
    parts = [p for p in path.parts if p != "."]
    return PurePosixPath(*parts) if parts else None


def extract_deb(deb: Path, dest: Path, want: Callable[[str], bool]) -> int:
    """Write the regular files of ``deb``'s data archive whose path (``usr/...``) ``want`` accepts under
    ``dest`` (emptied first); returns how many. Links, devices and members leaving ``dest`` are skipped."""
    where = str(deb)
    try:
        data = deb.read_bytes()
    except OSError as e:
        raise DebError(f"{where}: cannot read it ({e.strerror})") from None
    tars = [(name, blob) for name, blob in ar_members(data, where) if name.startswith("data.tar")]
    if not tars:
        raise DebError(f"{where}: no data.tar member; is it a Debian package?")
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    written = 0
    with _open_data_tar(tars[0][0], tars[0][1], where) as tar:
        for member in tar:
            rel = safe_member_path(member.name)
            if rel is None or not member.isreg() or not want(rel.as_posix()):
                continue
            target = dest.joinpath(*rel.parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(member)
            assert source is not None  # a regular file always has content
            with source, open(target, "wb") as out:
                shutil.copyfileobj(source, out)
            written += 1
    return written


@dataclass(frozen=True)
class Package:
    name: str
    root: Path  # the folder holding the package's tree (usr/...)
    source: str  # the .deb file or folder it came from
    version: str  # from the .deb's file name; "" for a folder


def find_deb(debs: Path, name: str) -> Path | None:
    """``debs/NAME_VERSION_ARCH.deb`` (the newest name when several), or None."""
    found = sorted(debs.glob(f"{name}_*.deb"))
    return found[-1] if found else None


def package_root(debs: Path, name: str, dest: Path, want: Callable[[str], bool]) -> Package:
    """The package ``name`` from ``debs`` (see the module docstring); ``RecipeError`` naming the ``apt-get
    download`` command when it is in none of the three forms."""
    if not debs.is_dir():
        raise RecipeError(f"debs={debs} is not a folder; pass the folder where `apt-get download ...` wrote the .debs")
    deb = find_deb(debs, name)
    if deb is not None:
        extract_deb(deb, dest / name, want)
        version = deb.stem.split("_")[1] if deb.stem.count("_") >= 2 else ""
        return Package(name, dest / name, str(deb), version)
    for folder in (debs / name, debs):
        if (folder / "usr").is_dir():
            return Package(name, folder, str(folder), "")
    raise RecipeError(
        f"no {name}_*.deb, no unpacked {debs / name}/usr and no {debs}/usr: run `apt-get download {name}` "
        f"in {debs} (or unpack it there with `dpkg-deb -x {name}_*.deb {debs / name}`)"
    )
