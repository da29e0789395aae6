"""The on-disk cache of compiled libraries behind ``aotc.jit``.

One entry per key: a directory ``ROOT/KEY/`` holding what a compile delivered (NAME.h, libNAME.so,
NAME.json, NAME.cdef, aotc_types.h) and ``entry.json``, the manifest: the key and each file's SHA-256.

- Two processes asking for one key at once: each entry has a lock file (``ROOT/KEY.lock``, flock);
  the first builds the entry in a temporary directory beside it and renames it into place, the
  other waits for the lock and then finds the entry. A reader never sees a half-built entry.
- Damage (a truncated library, a missing file, an unreadable manifest, a library that does not load)
  is found by the manifest's hashes or by the load, and the entry is rebuilt.
- Size: after each new entry, entries are removed least recently used first (a load marks an entry
  used) until the cache holds at most ``max_bytes``; an entry another process holds is skipped.
  Removal renames the directory away before deleting it, so a library already loaded keeps working.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from aotc.errors import AotcError

ENV_DIR = "AOTC_CACHE_DIR"
DEFAULT_MAX_BYTES = 2 << 30
MANIFEST = "entry.json"
_TMP = ".tmp-"      # an entry being built: .tmp-KEY-random
_TRASH = ".trash-"  # an entry being removed

T = TypeVar("T")


def default_cache_dir() -> Path:
    """``$AOTC_CACHE_DIR``, else ``$XDG_CACHE_HOME/aotc``, else ``~/.cache/aotc``."""
    env = os.environ.get(ENV_DIR)
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "aotc"


@dataclass(frozen=True)
class Entry:
    key: str
    path: Path
    size: int            # bytes of its files
    last_used_ns: int    # the manifest's mtime, set on every load


class LibraryCache:
    """Entries under ``root`` (default: ``default_cache_dir()``), at most ``max_bytes`` in all (None: no
    limit)."""

    def __init__(self, root: str | Path | None = None, max_bytes: int | None = DEFAULT_MAX_BYTES) -> None:
        self.root = Path(root) if root is not None else default_cache_dir()
        if max_bytes is not None and max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes

    def get(self, key: str, build: Callable[[Path], None], load: Callable[[Path], T]) -> tuple[T, bool]:
        """``load(entry directory)`` for ``key``, building the entry first with ``build(empty
        directory)`` if it is missing or damaged. Returns the loaded value and whether it was built."""
        _check_key(key)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise AotcError(f"cannot create the aotc cache {self.root}: {e.strerror or e}") from None
        path = self.root / key
        with self._locked(key):
            if path.exists():
                try:
                    _verify(path, key)
                    value = load(path)
                    _touch(path)
                    return value, False
                except (AotcError, OSError, ValueError):
                    _remove(path)  # damaged: built again below
            self._remove_leftovers(key)
            tmp = Path(tempfile.mkdtemp(prefix=f"{_TMP}{key}-", dir=self.root))
            try:
                build(tmp)
                _seal(tmp, key)
                os.rename(tmp, path)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            try:
                value = load(path)
            except BaseException:
                _remove(path)
                raise
        self.evict(keep={key})
        return value, True

    def entries(self) -> list[Entry]:
        """The complete entries, least recently used first."""
        found = []
        with contextlib.suppress(FileNotFoundError):
            for path in self.root.iterdir():
                if path.name.startswith(".") or not path.is_dir():
                    continue
                try:
                    used = (path / MANIFEST).stat().st_mtime_ns
                    size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
                except OSError:
                    continue  # being removed, or damaged (found and rebuilt by ``get``)
                found.append(Entry(path.name, path, size, used))
        return sorted(found, key=lambda e: (e.last_used_ns, e.key))

    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries())

    def evict(self, keep: set[str] | frozenset[str] = frozenset()) -> list[str]:
        """Remove least recently used entries (not those in ``keep``, nor those another process holds
        now) until at most ``max_bytes`` remain; returns the keys removed."""
        if self.max_bytes is None:
            return []
        entries = self.entries()
        total = sum(e.size for e in entries)
        removed = []
        for e in entries:
            if total <= self.max_bytes:
                break
            if e.key in keep:
                continue
            with self._locked(e.key, wait=False) as held:
                if not held or not e.path.exists():
                    continue
                _remove(e.path)
                (self.root / f"{e.key}.lock").unlink(missing_ok=True)  # waiters notice (see _locked)
            total -= e.size
            removed.append(e.key)
        return removed

    @contextlib.contextmanager
    def _locked(self, key: str, wait: bool = True) -> Iterator[bool]:
        """Hold ``key``'s lock file. Eviction unlinks a lock file while holding it, so a process that
        got the lock on a file no longer at that path takes it again on the new one."""
        path = self.root / f"{key}.lock"
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                os.close(fd)
                yield False
                return
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        try:
            yield True
        finally:
            os.close(fd)

    def _remove_leftovers(self, key: str) -> None:
        """Temporary directories of builds of ``key`` that were killed (the lock is held: no build of
        it runs now) and trash a removal left."""
        for path in self.root.glob(f"{_TMP}{key}-*"):
            shutil.rmtree(path, ignore_errors=True)
        for path in self.root.glob(f"{_TRASH}{key}-*"):
            shutil.rmtree(path, ignore_errors=True)


def _check_key(key: str) -> None:
    if not key or not all(c in "0123456789abcdef" for c in key):
        raise ValueError(f"a cache key is lowercase hex, got {key!r}")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _seal(path: Path, key: str) -> None:
    """Write the manifest of the built entry at ``path`` (last: an entry without one is damaged)."""
    files = {f.name: _sha256(f) for f in sorted(path.iterdir()) if f.is_file()}
    if not files:
        raise AotcError(f"the build for cache entry {key} produced no files")
    (path / MANIFEST).write_text(json.dumps({"key": key, "files": files}, indent=1, sort_keys=True))


def _verify(path: Path, key: str) -> None:
    """Raise ValueError unless every file the manifest lists is there with its hash."""
    manifest = json.loads((path / MANIFEST).read_text())
    if not isinstance(manifest, dict) or manifest.get("key") != key or not isinstance(manifest.get("files"), dict):
        raise ValueError(f"{path / MANIFEST} is not this entry's manifest")
    for name, digest in manifest["files"].items():
        if "/" in name or _sha256(path / name) != digest:
            raise ValueError(f"{path / name} does not match its hash")


def _touch(path: Path) -> None:
    now = time.time_ns()  # given explicitly: a file system stamps its own times at a coarser tick
    os.utime(path / MANIFEST, ns=(now, now))


def _remove(path: Path) -> None:
    """Rename away, then delete: the entry disappears at once, and files a process has mapped (a
    loaded library) stay valid for it."""
    trash = path.with_name(f"{_TRASH}{path.name}-{os.getpid()}-{time.time_ns()}")
    try:
        os.rename(path, trash)
    except FileNotFoundError:
        return
    shutil.rmtree(trash, ignore_errors=True)
