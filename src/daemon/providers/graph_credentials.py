"""Reading a Graph application's credential: a client secret or a certificate
(docs/providers.md "Microsoft Graph setup")."""

from __future__ import annotations

import re
from pathlib import Path

from daemon.config.secret_text import read_secret_text

_CERTIFICATE = re.compile(r"-----BEGIN CERTIFICATE-----\s.*?-----END CERTIFICATE-----", re.DOTALL)
_PRIVATE_KEY = re.compile(
    r"-----BEGIN (?:RSA |EC |ENCRYPTED )?PRIVATE KEY-----\s.*?"
    r"-----END (?:RSA |EC |ENCRYPTED )?PRIVATE KEY-----",
    re.DOTALL,
)


def read_client_secret(path: Path) -> str:
    """The secret: the file's first line. ValueError names why not, also for a character
    no Azure secret holds (a byte order mark a Windows editor wrote, a zero-width or
    no-break space pasted from a web page): sent as read, Azure would refuse it as an
    invalid secret at the first send, and the log would name no file."""
    text = read_secret_text(path)
    secret = text.splitlines()[0].strip() if text else ""
    if not secret:
        raise ValueError(f"{path}: empty (the client secret is its first line)")
    bad = next((c for c in secret if not c.isprintable()), None)
    if bad is not None:
        what = (
            "a byte order mark: save the file as UTF-8 without one"
            if bad == "\ufeff"
            else "an invisible character: type the secret again"
        )
        raise ValueError(f"{path}: the client secret holds U+{ord(bad):04X}, {what}")
    return secret


def read_certificate(path: Path) -> dict[str, str]:
    """msal's certificate credential from one PEM file holding the private key and the
    certificate registered with the application (msal derives the SHA-256 thumbprint
    from the certificate). ValueError names what is missing."""
    text = read_secret_text(path)
    key = _PRIVATE_KEY.search(text)
    certificate = _CERTIFICATE.search(text)
    if key is None:
        raise ValueError(f"{path}: no PEM private key in it")
    if certificate is None:
        raise ValueError(f"{path}: no PEM certificate in it (the one registered with the app)")
    if "ENCRYPTED" in key.group(0):
        raise ValueError(f"{path}: the private key is encrypted; store it unencrypted, mode 0600")
    return {"private_key": key.group(0), "public_certificate": certificate.group(0)}
