"""Tiny Debian packages written in the test: an ``ar`` archive of ``debian-binary``, ``control.tar.xz`` and a
``data.tar.{xz,gz}`` holding the given files (``dpkg-deb`` is not needed)."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Mapping
from pathlib import Path


def ar_archive(members: list[tuple[str, bytes]]) -> bytes:
    out = bytearray(b"!<arch>\n")
    for name, data in members:
        header = f"{name + '/':<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n".encode()
        assert len(header) == 60
        out += header + data + (b"\n" if len(data) % 2 else b"")
    return bytes(out)


def tar_bytes(files: Mapping[str, bytes], compression: str = "xz", links: Mapping[str, str] | None = None) -> bytes:
    """A tar of ``files`` (path -> content, paths as written, e.g. ``./usr/...``) and symbolic ``links``."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w" if compression == "zst" else f"w:{compression}") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    if compression == "zst":  # as dpkg-deb -Zzstd writes it: a stream without the content size in its header
        import zstandard

        stream = zstandard.ZstdCompressor().compressobj()
        return stream.compress(buffer.getvalue()) + stream.flush()
    return buffer.getvalue()


def write_deb(
    folder: Path,
    package: str,
    files: Mapping[str, bytes],
    compression: str = "xz",
    links: Mapping[str, str] | None = None,
    version: str = "1.0-1",
) -> Path:
    """``folder/{package}_{version}_all.deb`` holding ``files`` (paths relative to the root: ``usr/...``)."""
    data = tar_bytes({f"./{name}": content for name, content in files.items()}, compression, links)
    control = tar_bytes({"./control": f"Package: {package}\nVersion: {version}\n".encode()}, "xz")
    path = folder / f"{package}_{version}_all.deb"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_bytes(
        ar_archive([("debian-binary", b"2.0\n"), ("control.tar.xz", control), (f"data.tar.{compression}", data)])
    )
    return path


def unpack_to(folder: Path, files: Mapping[str, bytes]) -> Path:
    """The same files as an unpacked package (``dpkg-deb -x``) under ``folder``."""
    for name, content in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    return folder
