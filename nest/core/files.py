"""Output files written whole or not at all.

Every file the tool writes (``plan.json``, ``report.json``, summaries, tables, figures) goes
through :func:`atomic_path`: the writer fills a temporary file in the same directory, which then
replaces the target in one ``os.replace`` (atomic on POSIX and Windows within one file system).
A write that fails half-way (a full disk, Ctrl-C, a crash) leaves the previous file as it was
and no partial file behind, so a reader never sees half a report.
"""

import contextlib
import errno
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
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(exc, OSError) and not exc.filename:  # flush/close: name the file
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
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


INTERRUPTED = (
    "interrupted (Ctrl-C): the run stopped; files already written are whole (each is written "
    "atomically), the others were not written"
)

# What an output directory that cannot be written raises: no permission, a file where a directory
# should be, a read-only file system, a full disk or quota.
_OUTPUT_ERRNOS = {
    errno.EACCES,
    errno.EPERM,
    errno.EEXIST,
    errno.ENOTDIR,
    errno.EISDIR,
    errno.EROFS,
    errno.ENOSPC,
    errno.EDQUOT,
}


class Unwritable(SystemExit):
    """A single run's output that cannot be written, as the one line to print (``line``); exit
    status 2. A ``SystemExit``, so Hydra passes it through without its "Error executing job"
    report, and :func:`nest.app.cli.main` prints the line."""

    def __init__(self, line: str):
        super().__init__(2)
        self.line = line


def _in_mkdir(exc: BaseException) -> bool:
    """Whether ``exc`` was raised making a directory (a run directory nothing can create, e.g.
    under ``/proc``), not reading a missing file."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code.co_name == "mkdir"


def output_error_line(exc: BaseException) -> str | None:
    """One line for an output file or directory that cannot be written (the path, the reason
    and the fix), or None."""
    seen = exc
    while seen is not None and not (
        isinstance(seen, OSError)
        and seen.filename
        and (seen.errno in _OUTPUT_ERRNOS or (seen.errno == errno.ENOENT and _in_mkdir(seen)))
    ):
        seen = seen.__cause__ or seen.__context__
    if seen is None:
        return None
    if seen.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = "free space on that disk or point hydra.run.dir=DIR at another one"
    else:
        fix = "point hydra.run.dir=DIR (hydra.sweep.dir=DIR in a multirun) at a writable directory"
    return f"cannot write {seen.filename}: {seen.strerror}; {fix}"


__all__ = [
    "INTERRUPTED",
    "MAX_NAME_BYTES",
    "Unwritable",
    "atomic_path",
    "output_error_line",
    "safe_name",
    "write_text",
]
