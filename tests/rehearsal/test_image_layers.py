"""Task image layers applied in order (rehearsal/task_image.py): whiteouts, opaque directories, links,
zstd, and no entry of a layer reaching outside the root. Layers are built here with tarfile."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from pathlib import Path

import pytest
import zstandard

from rehearsal.task_image import apply_layer, parse_image_reference


def layer(*entries: tuple, compress: str = "gzip") -> io.BytesIO:
    """entries: (name, "file", data) | (name, "dir") | (name, "sym", target) | (name, "link", target)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, *rest in entries:
            info = tarfile.TarInfo(name)
            if kind == "file":
                data = rest[0] if rest else b""
                info.size, info.mode = len(data), rest[1] if len(rest) > 1 else 0o644
                tar.addfile(info, io.BytesIO(data))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "sym": tarfile.SYMTYPE, "link": tarfile.LNKTYPE,
                         "chr": tarfile.CHRTYPE}[kind]
            info.mode = 0o755
            if rest:
                info.linkname = rest[0]
            tar.addfile(info)
    raw = buf.getvalue()
    data = {"gzip": gzip.compress(raw), "zstd": zstandard.ZstdCompressor().compress(raw), "none": raw}[compress]
    return io.BytesIO(data)


def test_layers_apply_in_order_with_whiteouts_and_opaque_directories(tmp_path):
    root = tmp_path / "rootfs"
    root.mkdir()
    apply_layer(layer(("etc", "dir"), ("etc/a", "file", b"1"), ("etc/b", "file", b"2"), ("opt", "dir"),
                      ("opt/keep", "file", b"k"), ("opt/old", "file", b"o"), ("usr", "dir"),
                      ("usr/bin", "dir"), ("usr/bin/tool", "file", b"#!x", 0o755), ("bin", "sym", "usr/bin")),
                root)
    apply_layer(layer(("etc/.wh.a", "file"), ("opt", "dir"), ("opt/new", "file", b"n"), ("opt/.wh..wh..opq", "file"),
                      ("etc/b", "file", b"changed"), compress="zstd"), root)
    assert not (root / "etc" / "a").exists() and (root / "etc" / "b").read_bytes() == b"changed"
    assert sorted(os.listdir(root / "opt")) == ["new"]  # opaque: the lower layer's entries go, this layer's stay
    assert (root / "bin").is_symlink() and os.access(root / "bin" / "tool", os.X_OK)
    assert not any(n.startswith(".wh.") for _, _, files in os.walk(root) for n in files)


def test_a_later_layer_replaces_a_symlink_instead_of_writing_through_it(tmp_path):
    root = tmp_path / "rootfs"
    root.mkdir()
    (tmp_path / "outside").write_text("host file")
    apply_layer(layer(("etc", "dir"), ("etc/conf", "sym", "../../outside")), root)
    apply_layer(layer(("etc/conf", "file", b"image file")), root)
    assert (tmp_path / "outside").read_text() == "host file"
    assert not (root / "etc" / "conf").is_symlink() and (root / "etc" / "conf").read_bytes() == b"image file"


@pytest.mark.parametrize("entries", [
    (("../escape", "file", b"x"),),
    (("etc", "sym", "/"), ("etc/escape", "file", b"x")),  # through an absolute symlink: the host's /
    (("link", "sym", "../.."), ("link/escape", "file", b"x")),
    (("hard", "link", "../../outside"),),
    (("etc", "dir"), ("etc/.wh.x", "file"), ("../.wh.outside", "file")),
])
def test_no_entry_reaches_outside_the_root(tmp_path, entries):
    root = tmp_path / "a" / "rootfs"
    root.mkdir(parents=True)
    (tmp_path / "outside").write_text("host file")
    with pytest.raises(tarfile.TarError):
        apply_layer(layer(*entries), root)
    assert (tmp_path / "outside").read_text() == "host file"
    assert not (tmp_path / "a" / "escape").exists() and not (tmp_path / "escape").exists()
    assert not Path("/escape").exists()


def test_hardlinks_inside_the_root_and_device_nodes_skipped(tmp_path):
    root = tmp_path / "rootfs"
    root.mkdir()
    apply_layer(layer(("usr", "dir"), ("usr/a", "file", b"same"), ("usr/b", "link", "usr/a"),
                      ("dev", "dir"), ("dev/null", "chr")), root)
    assert os.stat(root / "usr" / "a").st_ino == os.stat(root / "usr" / "b").st_ino
    assert not (root / "dev" / "null").exists()


@pytest.mark.parametrize("text, expected", [
    ("ubuntu:22.04", ("docker.io", "library/ubuntu", "22.04", None)),
    ("docker.io/library/ubuntu:22.04", ("docker.io", "library/ubuntu", "22.04", None)),
    ("ghcr.io/org/img@sha256:" + "a" * 64, ("ghcr.io", "org/img", None, "sha256:" + "a" * 64)),
    ("127.0.0.1:5000/x/y:t", ("127.0.0.1:5000", "x/y", "t", None)),
    ("localhost/x", ("localhost", "x", None, None)),
])
def test_image_references(text, expected):
    r = parse_image_reference(text)
    assert (r.registry, r.repository, r.tag, r.digest) == expected
