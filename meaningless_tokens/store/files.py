"""Atomic files: a temporary file renamed onto the output only on success; a filesystem fault is one line naming
the file (OutputError)."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

from meaningless_tokens.errors import OutputError


def os_reason(e: OSError) -> str:
    """The reason of an OSError in a few words: its strerror, or the errno h5py buries in its message."""
    import re

    if e.errno:
        return os.strerror(e.errno)
    m = re.search(r"errno = (\d+)", str(e))
    if m:
        return os.strerror(int(m.group(1)))
    return " ".join(str(e.strerror or e).split())[:300] or type(e).__name__


def os_error_line(e: OSError) -> str:
    """`<path>: <reason>` of an OSError (the command line's `error:` line for a filesystem fault)."""
    return f"{e.filename if e.filename is not None else '?'}: {os_reason(e)}"


def fs_error(e: OSError, path: str | os.PathLike) -> OutputError:
    """`<path>: <reason>` for an OSError met while writing `path` (the OSError's own file where it names one)."""
    return OutputError(f"{e.filename or path}: {os_reason(e)}")


@contextlib.contextmanager
def atomic_path(final: str | os.PathLike):
    """Yield a temporary path beside `final`; rename it onto `final` only if the block succeeds.

    A crash or Ctrl-C leaves the old `final` (or nothing) in place, never a half-written file; a temporary
    file a killed run left behind (`.<name>.*.partial`) is removed when the next writer of `final` starts.
    A filesystem fault (full disk, read-only or missing folder, permission denied) is an OutputError naming the
    file. The file gets the mode any tool's output gets (0666 less the umask: 0644 with the usual 022), not
    mkstemp's private 0600, so a shared workspace or a web server can read what the pipeline wrote.
    """
    final = Path(final)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        for stale in final.parent.glob(f".{glob_escape(final.name)}.*.partial"):
            stale.unlink(missing_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".partial", dir=final.parent)
        os.close(fd)
    except OSError as e:
        raise fs_error(e, final) from None
    tmp = Path(tmp)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, final)
    except OSError as e:
        raise fs_error(e, final) from None
    finally:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass


def glob_escape(name: str) -> str:
    import glob

    return glob.escape(name)


def _umask() -> int:
    """The process's umask (read without changing it where /proc says it; else set and restore)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_json_atomic(path: str | os.PathLike, data) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def write_csv_atomic(path: str | os.PathLike, header: list[str], rows) -> None:
    """A CSV table (the ones `dvc plots` draws), "\n" line ends whatever the platform."""
    import csv
    import io

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    with atomic_path(path) as tmp:
        tmp.write_text(buf.getvalue())
