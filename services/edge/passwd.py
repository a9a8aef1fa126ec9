"""A small mosquitto_passwd for machines without it: add or replace a user in a password file.

    hexmq passwd FILE USER            # asks for the password
    hexmq passwd FILE USER PASSWORD   # batch mode (the password is visible to other users in
                                      # `ps`)

(`python -m services.edge.passwd` is the same command.)

The line is written in mosquitto_passwd's default ``$7$`` (PBKDF2-HMAC-SHA512) form, or with
``--scram`` as a SCRAM-SHA-512 credential (StoredKey and ServerKey, RFC 5803's form: it serves
SCRAM-SHA-512 and CONNECT passwords, and reading it lets nobody log in; mosquitto cannot read
it); other lines are kept as they are; the file is created if missing (mode 0600).
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from pathlib import Path

from services.edge.auth import DEFAULT_ITERATIONS, SCRAM_ITERATIONS, hash_password, scram_entry


def set_password(
    path: Path, user: str, password: str, iterations: int, *, scram: bool = False
) -> None:
    if not user or ":" in user:
        raise ValueError("a user name must be non-empty and hold no ':'")
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    hashed = (
        scram_entry(password, iterations=iterations)
        if scram
        else hash_password(password, iterations=iterations)
    )
    entry = f"{user}:{hashed}"
    kept = [line for line in lines if line.partition(":")[0].strip() != user]
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write("\n".join([*kept, entry]) + "\n")
    tmp.replace(path)


def main(argv: list[str] | None = None, prog: str = "python -m services.edge.passwd") -> int:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Add or replace a user in a mosquitto password file (created if missing, "
        "mode 0600), in mosquitto_passwd's default $7$ (PBKDF2-HMAC-SHA512) form.",
    )
    parser.add_argument("file", type=Path, help="the password file (--password-file of the edge)")
    parser.add_argument("user", help="the user name (no ':')")
    parser.add_argument(
        "password", nargs="?", help="the password; asked for twice when left out (safer)"
    )
    parser.add_argument(
        "--iterations",
        type=int,
        default=None,
        help=f"PBKDF2 iterations (default {DEFAULT_ITERATIONS}, as mosquitto_passwd; with "
        f"--scram {SCRAM_ITERATIONS}, as RFC 7677 asks)",
    )
    parser.add_argument(
        "--scram",
        action="store_true",
        help="write a SCRAM-SHA-512 credential (salt, iterations, StoredKey, ServerKey) "
        "instead of a $7$ hash: it serves SCRAM-SHA-512 (--auth-method) and CONNECT "
        "passwords, and whoever reads the file cannot log in with it; mosquitto cannot "
        "read such a line",
    )
    args = parser.parse_args(argv)
    iterations = args.iterations
    if iterations is None:
        iterations = SCRAM_ITERATIONS if args.scram else DEFAULT_ITERATIONS
    if iterations < 1:
        parser.error("--iterations must be at least 1")
    password = args.password
    if password is None:
        password = getpass.getpass("Password: ")
        if getpass.getpass("Reenter password: ") != password:
            print("passwords do not match", file=sys.stderr)
            return 1
    try:
        set_password(args.file, args.user, password, iterations, scram=args.scram)
    except (OSError, ValueError) as exc:
        print(f"{args.file}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
