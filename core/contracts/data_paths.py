"""Where a run may read training data: the data roots the operator names per cluster (`data_roots` in the
clusters file). A spec's `data_path` is a path relative to a root (an absolute path that lies lexically inside a
root is taken as relative to it); after symlinks are resolved it must still lie inside that root and name a
regular file. A cluster without data roots offers only the synthetic stream.

The API checks the form always, and the file itself when it can see a root; the runner checks again, on the
open file descriptor, before it reads anything (runner.data). Every refusal of an existing or missing path gets
the same message: an error never tells what exists outside the roots, nor whether a path inside them is missing,
a directory or a FIFO.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path, PurePosixPath

# A path-like character set: letters, digits and . _ - + / @ = , % ~ (no whitespace, no control character, no
# quote, no ':' or brace: nothing that a log parser or a shell could read as more than a file name).
_PATH_RE = re.compile(r"^[A-Za-z0-9._+/@=,%~-]+$")
MAX_DATA_PATH_CHARS = 1000
PATH_CHARS = "letters, digits and . _ - + / @ = , % ~"


class DataPathError(ValueError):
    """A data_path that is not allowed; the message never tells why beyond its form."""


def not_allowed(data_path: str, roots: list[str]) -> DataPathError:
    if not roots:
        return DataPathError(
            f"data_path {data_path!r}: this cluster has no data roots, so runs use the synthetic stream only "
            "(leave data_path out, or ask the operator to add data_roots to the cluster)"
        )
    return DataPathError(
        f"data_path {data_path!r} is not a regular file inside the cluster's data roots "
        f"({', '.join(roots)}); give a path relative to one of them"
    )


def check_form(data_path: str) -> str:
    """The path's characters and shape (no I/O): ValueError naming the allowed form."""
    if not data_path or len(data_path) > MAX_DATA_PATH_CHARS:
        raise DataPathError(f"data_path must be 1 to {MAX_DATA_PATH_CHARS} characters")
    if not _PATH_RE.match(data_path):
        raise DataPathError(f"data_path {data_path!r}: only {PATH_CHARS} (no whitespace or control characters)")
    if data_path.startswith("-"):
        raise DataPathError(f"data_path {data_path!r} must not start with '-'")
    return data_path


def relative_to_roots(data_path: str, roots: list[str]) -> str:
    """The path relative to a root (no I/O): a relative path as given (normalized), an absolute one with its root
    removed. DataPathError when it is absolute outside every root, or climbs out with '..'."""
    check_form(data_path)
    p = PurePosixPath(data_path)
    if p.is_absolute():
        for root in roots:
            try:
                p = p.relative_to(PurePosixPath(root))
                break
            except ValueError:
                continue
        else:
            raise not_allowed(data_path, roots)
    parts = [part for part in p.parts if part not in ("", ".")]
    if not parts or ".." in parts:
        raise not_allowed(data_path, roots)
    return "/".join(parts)


def root_problem(root: str) -> str | None:
    """Why a data root (absolute, normalized) cannot serve files, or None. resolve() requires the whole real path
    of a file, root included, to match _PATH_RE, because that path is what a command engine's {data_path} gets.
    Where this machine sees the root, its real path (symlinks resolved) is checked too: a link of a good name to
    a bad directory would otherwise load and then refuse every file."""
    real = os.path.realpath(root) if os.path.lexists(root) else root
    for path, what in ((root, ""), (real, f" (the real path of {root!r}, symlinks resolved)")):
        if not _PATH_RE.match(path):
            return (
                f"{path!r}{what} holds a character outside {PATH_CHARS} (a space, ':', a quote, a non-ASCII letter, "
                "...): a data file's real path, root included, is substituted into command-engine templates "
                "({data_path}), so every file under this root would be refused; use a directory whose path has "
                "only those characters"
            )
    return None


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def resolve(data_path: str, roots: list[str]) -> Path:
    """The real path of a regular file inside a root (roots tried in order), after symlinks are resolved.
    Stats only; opens nothing (a FIFO is refused without blocking). DataPathError otherwise."""
    rel = relative_to_roots(data_path, roots)
    for root in roots:
        real_root = os.path.realpath(root)
        candidate = os.path.realpath(os.path.join(real_root, rel))
        # a symlink inside a root may point outside it, or at a name no template should see
        if not _inside(candidate, real_root) or not _PATH_RE.match(candidate):
            continue
        try:
            if stat.S_ISREG(os.stat(candidate).st_mode):
                return Path(candidate)
        except OSError:
            continue
    raise not_allowed(data_path, roots)


def beside(data_path: str, suffix: str) -> str:
    """The relative path of a file beside the data file (its `.val` split, its `.json` recipe)."""
    return str(PurePosixPath(data_path).with_suffix(suffix))


def roots_visible(roots: list[str]) -> bool:
    """Whether this machine sees any of the roots (the API checks the file only then; the runner always)."""
    return any(os.path.isdir(r) for r in roots)


def name_in_root(path: str | Path, roots: list[str]) -> str | None:
    """The file's name relative to the root that holds it (after symlinks), or None outside every root."""
    real = os.path.realpath(path)
    for root in roots:
        real_root = os.path.realpath(root)
        if _inside(real, real_root) and real != real_root:
            return os.path.relpath(real, real_root)
    return None
