"""Credential files google-auth accepts, pointing at the emulator's token endpoint.

The key is real (google-auth signs the JWT assertion with it) but belongs to no Google
project, so the files are useless anywhere but against the emulator.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import threading
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

_key_lock = threading.Lock()
_key_pem: str | None = None


def _private_key_pem() -> str:
    # Generated once per process: tests write many files. 1024 bits, not 2048: only the
    # emulator ever sees what it signs, and google-auth validates the key each time it
    # loads it (every daemon start), ~0.1 s of CPU at 2048 bits, ~0.013 s at 1024.
    global _key_pem
    with _key_lock:
        if _key_pem is None:
            key = rsa.generate_private_key(public_exponent=65537, key_size=1024)
            _key_pem = key.private_bytes(
                encoding=serialization.Encoding.PEM,
                format=serialization.PrivateFormat.PKCS8,
                encryption_algorithm=serialization.NoEncryption(),
            ).decode("ascii")
        return _key_pem


def _write_secret(path: Path, info: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    # Created 0600 like a real key file should be, so a test never normalises looser modes.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(info, handle, indent=2)
        handle.write("\n")
    return path


def write_service_account(
    path: Path,
    *,
    token_uri: str,
    client_email: str = "sendledger@test-project.iam.gserviceaccount.com",
) -> Path:
    pem = _private_key_pem()
    domain = client_email.partition("@")[2]
    project_id = domain.split(".", 1)[0] if domain.endswith(".iam.gserviceaccount.com") else ""
    info = {
        "type": "service_account",
        "project_id": project_id or "test-project",
        "private_key_id": hashlib.sha1(pem.encode("ascii")).hexdigest(),
        "private_key": pem,
        "client_email": client_email,
        "client_id": str(
            10**20 + int.from_bytes(hashlib.sha256(client_email.encode()).digest()[:8])
        ),
        "auth_uri": "https://accounts.google.com/o/oauth2/auth",
        "token_uri": token_uri,
        "auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
        "universe_domain": "googleapis.com",
    }
    return _write_secret(path, info)


def write_authorized_user(path: Path, *, token_uri: str) -> Path:
    info = {
        "type": "authorized_user",
        "client_id": f"{secrets.randbelow(10**12):012d}-emulator.apps.googleusercontent.com",
        "client_secret": "GOCSPX-" + secrets.token_urlsafe(21),
        "refresh_token": "1//emu-" + secrets.token_urlsafe(48),
        "token_uri": token_uri,
    }
    return _write_secret(path, info)
