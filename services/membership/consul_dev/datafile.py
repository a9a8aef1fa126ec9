"""--data-dir: the whole state in one JSON file, replaced atomically on every change.

Write to a temporary file, fsync it, rename it over the old one, fsync the directory: after a
crash the file is the old state or the new one, never a mix. A lock file (flock) keeps a second
server off the same directory.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any, TextIO

STATE_FILE = "state.json"
LOCK_FILE = "lock"


class DataDirError(Exception):
    """The data directory cannot be used; the message names it and why."""


class DataDir:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = path / STATE_FILE
        self._lock: TextIO | None = None

    def lock(self) -> None:
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            handle = (self.path / LOCK_FILE).open("w")
        except OSError as exc:
            raise DataDirError(f"--data-dir {self.path}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise DataDirError(
                f"--data-dir {self.path} is in use by another hexmq consul-dev "
                f"(it holds {self.path / LOCK_FILE})"
            ) from None
        self._lock = handle

    def unlock(self) -> None:
        if self._lock is not None:
            self._lock.close()  # closing the file releases the flock
            self._lock = None

    def load(self) -> dict[str, Any] | None:
        """The saved state, or None if there is none yet."""
        try:
            text = self.file.read_text()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise DataDirError(f"{self.file}: {exc.strerror or exc}") from None
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise DataDirError(f"{self.file} is not valid JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise DataDirError(f"{self.file} does not hold a JSON object")
        return doc

    def save(self, doc: dict[str, Any]) -> None:
        """Replace the state file atomically and durably (OSError on failure)."""
        data = json.dumps(doc, separators=(",", ":")).encode()
        tmp = self.file.with_name(STATE_FILE + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.file)
        dir_fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
