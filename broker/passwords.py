"""Mosquitto's password file, edited by the coordinator on enrol and revoke.

:class:`PasswordFile` has the ``add(username, password)`` / ``remove(username)`` shape of
``coordinator.brokerauth.BrokerAccounts`` (structurally: the broker and coordinator
packages never import each other), so ``meshfl coordinator serve`` can hand it to the
coordinator. Each change rewrites the file atomically and then calls ``reload`` — for
Mosquitto, :func:`sighup_reloader`: SIGHUP makes Mosquitto re-read its password and ACL
files without dropping connections.

Hash format (Mosquitto 2.0's ``mosquitto_passwd`` default, checked against the real
broker in ``tests/integration/test_broker_security.py``)::

    username:$7$ITERATIONS$BASE64(SALT)$BASE64(PBKDF2-HMAC-SHA512(password, SALT, ITERATIONS))

with a 12-byte random salt, 64-byte derived key, standard base64 with padding, and
:data:`ITERATIONS` = 101 (Mosquitto's default). Hashes are made with :mod:`hashlib`, so a
coordinator host needs no Mosquitto binary.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import fcntl
import hashlib
import hmac
import os
import re
import secrets
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from meshfl.errors import ConfigError
from meshfl.files import atomic_write

__all__ = [
    "ITERATIONS",
    "PasswordFile",
    "hash_password",
    "sighup_reloader",
    "validate_username",
    "verify_password",
]

ITERATIONS = 101
"""PBKDF2 iterations of a new hash: Mosquitto 2.0's default (``mosquitto_passwd -I``)."""

SALT_BYTES = 12
"""Salt length in bytes (Mosquitto's ``SALT_LEN``)."""

_USERNAME = re.compile(r"[A-Za-z0-9_.@\-]{1,128}")


def validate_username(username: str) -> str:
    """Return ``username`` if it may be a broker login; raise ConfigError otherwise.

    1-128 characters from ``A-Z a-z 0-9 _ . @ -``: never ``:`` (the file's separator),
    ``/``, ``+`` or ``#`` (Mosquitto refuses ``%u`` ACL patterns for such names), nor
    whitespace.
    """
    if not isinstance(username, str) or _USERNAME.fullmatch(username) is None:
        raise ConfigError(
            f"invalid broker username {username!r}: use 1-128 characters from A-Z, a-z, 0-9,"
            " '_', '.', '@', '-'"
        )
    return username


def hash_password(password: str, *, salt: bytes | None = None, iterations: int = ITERATIONS) -> str:
    """Return Mosquitto's ``$7$`` PBKDF2-SHA512 hash of ``password``.

    Parameters
    ----------
    password : str
        The password (UTF-8 encoded before hashing); must not be empty.
    salt : bytes or None
        The salt; None draws :data:`SALT_BYTES` random bytes (pass one only in tests).
    iterations : int, default ITERATIONS
        PBKDF2 iterations (at least 1).

    Returns
    -------
    str
        ``$7$ITERATIONS$SALT_B64$HASH_B64``, the part after ``username:`` in the file.

    Raises
    ------
    ConfigError
        An empty password or a non-positive iteration count.

    """
    if not password:
        raise ConfigError("the broker password is empty; pass a non-empty password")
    if iterations < 1:
        raise ConfigError(f"PBKDF2 iterations must be >= 1 (got {iterations})")
    salt = secrets.token_bytes(SALT_BYTES) if salt is None else salt
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations)
    b64 = base64.b64encode
    return f"$7${iterations}${b64(salt).decode()}${b64(digest).decode()}"


def verify_password(password: str, encoded: str) -> bool:
    """Return True when ``password`` matches a ``$7$`` hash from :func:`hash_password`.

    Any other or malformed encoding gives False (constant-time comparison of digests).
    """
    parts = encoded.split("$")
    if len(parts) != 5 or parts[0] or parts[1] != "7" or not parts[2].isdigit():
        return False
    try:
        salt = base64.b64decode(parts[3], validate=True)
        digest = base64.b64decode(parts[4], validate=True)
    except (binascii.Error, ValueError):
        return False
    mine = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, int(parts[2]))
    return hmac.compare_digest(mine, digest)


def sighup_reloader(pid_file: Path) -> Callable[[], None]:
    """Return a ``reload()`` that sends SIGHUP to the process whose pid is in ``pid_file``.

    Mosquitto re-reads its configuration, password file and ACL file on SIGHUP. The pid
    file is read at each call, so a restarted broker is found. The reloader raises
    :class:`ConfigError` when the file is missing or malformed, or the process is gone or
    not ours to signal.
    """
    pid_file = Path(pid_file)

    def reload() -> None:
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"cannot reload the broker: no pid in {pid_file} ({exc}); check"
                " --broker-pid-file and that Mosquitto runs with `pid_file` set"
            ) from None
        try:
            os.kill(pid, signal.SIGHUP)
        except OSError as exc:
            raise ConfigError(
                f"cannot reload the broker: signal to pid {pid} from {pid_file} failed"
                f" ({exc.strerror}); is Mosquitto running as a user this process may signal?"
            ) from None

    return reload


class PasswordFile:
    """A Mosquitto password file: ``username:$7$...`` lines, one login per line.

    Parameters
    ----------
    path : Path
        The file Mosquitto's ``password_file`` option names; created on the first
        :meth:`add` (mode 0600) when missing. A rewrite keeps an existing file's mode.
    reload : callable or None
        Called after every change so that the broker re-reads the file (for Mosquitto:
        :func:`sighup_reloader`); None changes the file only.
    iterations : int, default ITERATIONS
        PBKDF2 iterations of new hashes.

    Notes
    -----
    Changes are serialised by a thread lock and, between processes (e.g. several
    coordinator workers), by ``flock`` on ``PATH.lock``. Lines this class did not write
    (comments, other users) are kept as they are.

    """

    def __init__(
        self,
        path: Path,
        reload: Callable[[], None] | None = None,
        *,
        iterations: int = ITERATIONS,
    ) -> None:
        self.path = Path(path)
        self.reload = reload
        self.iterations = iterations
        self._lock = threading.Lock()

    def add(self, username: str, password: str) -> None:
        """Create or replace the login ``username`` with ``password``, then reload the broker.

        Raises
        ------
        ConfigError
            An invalid username or empty password; the file cannot be written; the broker
            cannot be reloaded.

        """
        validate_username(username)
        line = f"{username}:{hash_password(password, iterations=self.iterations)}"
        self._change(username, line)

    def remove(self, username: str) -> None:
        """Delete the login ``username`` (no error when absent), then reload the broker.

        Raises
        ------
        ConfigError
            As for :meth:`add`.

        """
        validate_username(username)
        self._change(username, None)

    def usernames(self) -> list[str]:
        """Return the usernames in the file, in file order (empty when it does not exist)."""
        return [u for u, _ in self._entries(self._read())]

    def check(self, username: str, password: str) -> bool:
        """Return True when the file holds ``username`` with this ``password``."""
        entries = self._entries(self._read())
        return any(u == username and verify_password(password, h) for u, h in entries)

    def __contains__(self, username: object) -> bool:
        return username in self.usernames()

    # -- internals ------------------------------------------------------------------

    def _read(self) -> list[str]:
        try:
            return self.path.read_text().splitlines()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise ConfigError(
                f"cannot read the broker password file {self.path} ({exc.strerror});"
                " check --broker-password-file"
            ) from None

    @staticmethod
    def _entries(lines: list[str]) -> Iterator[tuple[str, str]]:
        for line in lines:
            if line and not line.startswith("#") and ":" in line:
                user, _, encoded = line.partition(":")
                yield user, encoded

    def _change(self, username: str, new_line: str | None) -> None:
        with self._lock, self._file_lock():
            lines = [ln for ln in self._read() if ln.partition(":")[0] != username]
            if new_line is not None:
                lines.append(new_line)
            try:
                mode = self.path.stat().st_mode & 0o777
            except FileNotFoundError:
                mode = 0o600
            text = "".join(f"{ln}\n" for ln in lines).encode()
            try:
                atomic_write(self.path, lambda f: f.write(text), mode=mode)
            except OSError as exc:
                raise ConfigError(
                    f"cannot write the broker password file {self.path} ({exc.strerror});"
                    " check --broker-password-file and its folder's permissions"
                ) from None
        if self.reload is not None:
            self.reload()

    @contextlib.contextmanager
    def _file_lock(self) -> Iterator[None]:
        lock_path = self.path.with_name(f"{self.path.name}.lock")
        try:
            lock_path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise ConfigError(
                f"cannot lock the broker password file ({lock_path}: {exc.strerror}); check"
                " --broker-password-file and its folder's permissions"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the flock
