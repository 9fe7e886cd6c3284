"""The one reader for every file a user names: configurations, plans, traces, logs, results, SQL
files, raw tables, schemas and topology files.

Every failure becomes one UsageError naming the file, the line or field where there is one, and what
to do: a missing file, a folder, a special file (a FIFO would block, a socket or device is not a
file), a dangling or looping link, no permission, bytes that are not UTF-8 text, JSON that is not
JSON or nests deeper than anything tilewise writes, a Parquet file that is empty, cut short or not
Parquet. What the files hold is checked where it is known: a results document's values by its kind's
typed view (results/body.py), a raw table's header by data/raw.py. Nothing here writes anything.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any

from tilewise.errors import UsageError

# tilewise's own documents nest a few levels; a limit far above that and far below Python's recursion
# limit turns a pathological file into one line instead of a RecursionError
MAX_DEPTH = 128

_KIND = {stat.S_ISFIFO: "a FIFO (named pipe)", stat.S_ISSOCK: "a socket", stat.S_ISCHR: "a character device",
         stat.S_ISBLK: "a block device"}


def _special(mode: int) -> str:
    """What a file that is neither a regular file nor a folder is: "a FIFO (named pipe)", "a socket", ..."""
    return next((k for test, k in _KIND.items() if test(mode)), "not a regular file")


def _refuse(path, what: str, problem: str, hint: str | None) -> UsageError:
    return UsageError(f"{what} {path}: {problem}" if what else f"{path}: {problem}", hint)


def _unreadable(path, what: str, e: OSError, hint: str | None) -> UsageError:
    return UsageError(f"cannot read {what + ' ' if what else ''}{path}: {_os_problem(Path(path), e)}", hint)


def check_file(path: str | os.PathLike, what: str = "", hint: str | None = None, *, devices: bool = False) -> Path:
    """path, when it names a regular file that can be opened for reading (following links); else one
    UsageError saying what it is instead. devices=True lets /dev/null and the like through."""
    p = Path(path)
    try:
        st = os.stat(p)
    except OSError as e:
        raise _unreadable(p, what, e, hint) from None
    if stat.S_ISDIR(st.st_mode):
        raise _refuse(p, what, "is a folder, not a file", hint)
    if not stat.S_ISREG(st.st_mode) and not (devices and stat.S_ISCHR(st.st_mode)):
        kind = _special(st.st_mode)
        raise _refuse(p, what, f"is {kind}, not a file", hint)
    if not os.access(p, os.R_OK):
        raise UsageError(f"cannot read {what + ' ' if what else ''}{p}: permission denied", hint)
    return p


def _os_problem(p: Path, e: OSError) -> str:
    if e.errno == errno.ENOENT and p.is_symlink():
        return f"is a link to {os.readlink(p)}, which does not exist"
    if e.errno == errno.ELOOP:
        return "is a link that loops (too many levels of symbolic links)"
    if e.errno == errno.ENOENT:
        return "does not exist"
    if e.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if e.errno == errno.ENOTDIR:
        return "a part of the path is a file, not a folder"
    return e.strerror or str(e)


def dir_problem(path: str | os.PathLike) -> str | None:
    """What stops path from being a folder tilewise reads or fills (None: nothing): it, or the first
    part of it that exists, is a file. Nothing is made."""
    p = Path(path)
    for q in (p, *p.parents):
        try:
            st = os.stat(q)
        except FileNotFoundError:
            continue
        except OSError as e:
            return _os_problem(q, e)
        if not stat.S_ISDIR(st.st_mode):
            return "is a file, not a folder" if q == p else f"{q} is a file, not a folder"
        return None
    return None


def check_dir(path: str | os.PathLike, option: str, hint: str | None = None) -> Path:
    """A folder the user names for tilewise to read or fill (--out, --data-dir, --layout-dir), checked
    without making it (dir_problem)."""
    why = dir_problem(path)
    if why:
        raise UsageError(f"cannot write to {option} {path}: {why}", hint or f"give {option} a folder")
    return Path(path)


def output_problem(path: str | os.PathLike) -> str | None:
    """What stops tilewise from writing the file path (None: nothing): it is a folder or a special file
    (writing to a FIFO would block), or its folder is missing or is a file. Nothing is made."""
    p = Path(path)
    if not str(path).strip():
        return "is empty"
    try:
        st = os.stat(p)
    except FileNotFoundError:
        st = None
    except OSError as e:
        return _os_problem(p, e)
    if st is not None and stat.S_ISDIR(st.st_mode):
        return "is a folder; name a file in it"
    if st is not None and not stat.S_ISREG(st.st_mode):
        kind = _special(st.st_mode)
        return f"is {kind}, not a file"
    parent = p.parent
    if not parent.is_dir():
        return f"its folder {parent} " + ("is a file" if parent.exists() else "does not exist")
    return None


def read_bytes(path: str | os.PathLike, what: str = "", hint: str | None = None, *, devices: bool = False) -> bytes:
    p = check_file(path, what, hint, devices=devices)
    try:
        return p.read_bytes()
    except OSError as e:
        raise _unreadable(p, what, e, hint) from None


def decode(data: bytes, path, what: str = "", hint: str | None = None) -> str:
    """UTF-8 text (a leading byte-order mark is dropped); bytes that are not name the line and the byte."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise _refuse(path, what, f"is not text: byte 0x{data[e.start]:02x} at line {line} (offset {e.start}) "
                      "is not UTF-8", hint) from None


def read_text(path: str | os.PathLike, what: str = "", hint: str | None = None, *, devices: bool = False) -> str:
    return decode(read_bytes(path, what, hint, devices=devices), path, what, hint)


def parse_json(text: str, source, what: str = "", hint: str | None = None, *, line: int | None = None) -> Any:
    """JSON from text read out of source (a path, for the message); line: the text is that line of the file."""
    where = f"{source}:{line}" if line is not None else str(source)
    try:
        doc = json.loads(text)
    except RecursionError:
        raise _refuse(where, what, f"nests deeper than {MAX_DEPTH} levels", hint) from None
    except ValueError as e:
        pos = f"line {e.lineno} column {e.colno}" if line is None else f"column {e.colno}"
        msg = getattr(e, "msg", str(e))
        raise _refuse(where, what, f"is not valid JSON ({msg} at {pos})", hint) from None
    if depth(doc) > MAX_DEPTH:
        raise _refuse(where, what, f"nests deeper than {MAX_DEPTH} levels", hint)
    return doc


def read_json(path: str | os.PathLike, what: str = "", hint: str | None = None) -> Any:
    return parse_json(read_text(path, what, hint), path, what, hint)


def depth(doc: Any) -> int:
    """How deeply doc's lists and objects nest (0 for a scalar), without recursion."""
    deepest, stack = 0, [(doc, 1)]
    while stack:
        node, d = stack.pop()
        if isinstance(node, dict):
            node = node.values()
        elif not isinstance(node, list):
            continue
        deepest = max(deepest, d)
        if d > MAX_DEPTH:
            return d
        stack.extend((v, d + 1) for v in node)
    return deepest


# ---- Parquet -------------------------------------------------------------------------------------------

def parquet_file(path: str | os.PathLike, what: str = "", hint: str | None = None):
    """An open pyarrow ParquetFile; an empty, cut-short or foreign file is one UsageError."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = check_file(path, what, hint)
    try:
        return pq.ParquetFile(p)
    except (pa.ArrowException, OSError, ValueError) as e:
        raise _refuse(p, what, parquet_problem(p, e), hint or "regenerate it or remove it") from None


def parquet_problem(path, exc: BaseException) -> str:
    """What is wrong with a Parquet file, from the exception reading it raised."""
    try:
        size = os.path.getsize(path)
    except OSError:
        size = None
    if size == 0:
        return "is empty, not a Parquet file"
    if size is not None and size < 12:  # the magic number twice and the footer's length
        return f"is {size} bytes: too small to be a Parquet file"
    text = " ".join(str(exc).split())
    if "magic bytes" in text or "not a parquet file" in text.lower():
        return "is not a Parquet file (or is cut short: its footer is missing)"
    return f"cannot be read as Parquet ({text[:160]})"
