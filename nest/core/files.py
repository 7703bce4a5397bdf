"""Output files written whole or not at all.

Every file the tool writes (``plan.json``, ``report.json``, summaries, tables, figures) goes
through :func:`atomic_path`: the writer fills a temporary file in the same directory, which then
replaces the target in one ``os.replace`` (atomic on POSIX and Windows within one file system).
A write that fails half-way (a full disk, Ctrl-C, a crash) leaves the previous file as it was
and no partial file behind, so a reader never sees half a report.
"""

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

MAX_NAME_BYTES = 200
"""The longest file name :func:`safe_name` makes, in UTF-8 bytes: below the 255 of ext4, XFS,
APFS and NTFS, leaving room for a suffix and the temporary file's prefix."""


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path next to ``path`` to write to; on success it replaces ``path``.

    The temporary name ends in ``path``'s suffix, so writers that choose a format by it
    (``savefig``, ``to_parquet``) choose the same.

    On an exception the temporary file is removed and ``path`` is left untouched.

    Examples
    --------
    >>> import tempfile
    >>> target = Path(tempfile.mkdtemp()) / "out.txt"
    >>> with atomic_path(target) as tmp:
    ...     _ = tmp.write_text("done")
    >>> target.read_text()
    'done'
    """
    path = Path(path)
    fd, tmp_name = tempfile.mkstemp(
        dir=path.parent, prefix=f".{path.stem[:50]}.", suffix=f".tmp{path.suffix}"
    )
    os.close(fd)
    tmp = Path(tmp_name)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # what open() would have given; mkstemp makes it 0600
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`atomic_path`); returns the path."""
    with atomic_path(path) as tmp, tmp.open("w", encoding="utf-8", newline="") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    return Path(path)


def safe_name(stem: str, suffix: str = "") -> str:
    """``stem + suffix`` as a file name any file system takes: path separators and control
    characters replaced by ``_`` and the stem cut to :data:`MAX_NAME_BYTES` UTF-8 bytes, with a
    short digest of the full stem when cut (two long names stay two files).

    Examples
    --------
    >>> safe_name("a/b", ".png")
    'a_b.png'
    >>> len(safe_name("m" * 300, ".png").encode()) <= MAX_NAME_BYTES + len(".png")
    True
    """
    clean = "".join("_" if c in '/\\:*?"<>|' or ord(c) < 32 else c for c in stem) or "_"
    if len(clean.encode()) > MAX_NAME_BYTES:
        digest = hashlib.sha1(stem.encode()).hexdigest()[:10]
        cut = clean.encode()[: MAX_NAME_BYTES - len(digest) - 1].decode(errors="ignore")
        clean = f"{cut}-{digest}"
    return clean + suffix


__all__ = ["MAX_NAME_BYTES", "atomic_path", "safe_name", "write_text"]
