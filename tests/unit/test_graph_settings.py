"""`[providers.NAME] kind = "graph"`: one-line errors naming the key, and the provider the
composition root builds (no network at build: the msal application is made on first use)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from daemon.bootstrap import build_provider
from daemon.config.secret_files import secret_files
from daemon.config.settings import ConfigError, GraphProviderSettings, settings_from_dict
from daemon.providers.base import for_job
from daemon.providers.graph import GraphMailboxView, GraphProvider

BASE: dict[str, Any] = {
    "kind": "graph",
    "tenant_id": "t-1",
    "client_id": "c-1",
    "client_secret_file": "secret",
    "user": "support@example.com",
}


def load(tmp_path: Path, **changes: Any) -> Any:
    fields = {**BASE, **changes}
    for key in [k for k, v in fields.items() if v is None]:
        del fields[key]
    return settings_from_dict(
        {"providers": {"m365": fields}}, config_path=tmp_path / "sendledger.toml"
    )


def test_defaults(tmp_path: Path) -> None:
    config = load(tmp_path).providers["m365"]
    assert isinstance(config, GraphProviderSettings)
    assert config.api_endpoint == "https://graph.microsoft.com/v1.0"
    assert config.authority == "https://login.microsoftonline.com"
    assert (config.timeout, config.max_concurrent, config.confirm_wait) == (10.0, 4, 3.0)
    assert (config.max_message_bytes, config.max_recipients) == (3_000_000, 500)


@pytest.mark.parametrize(
    ("changes", "where"),
    [
        ({"client_secret_file": None}, "providers.m365: client_secret_file"),
        ({"certificate_file": "app.pem"}, "providers.m365: client_secret_file"),
        ({"authority": "http://login.example"}, "providers.m365.authority"),
        ({"api_endpoint": "graph.microsoft.com"}, "providers.m365.api_endpoint"),
        ({"tenant_id": ""}, "providers.m365.tenant_id"),
        ({"user": None}, "providers.m365.user"),
        ({"max_concurrent": 0}, "providers.m365.max_concurrent"),
        ({"confirm_wait": "2m"}, "providers.m365.confirm_wait"),
        ({"timeout": "0s"}, "providers.m365.timeout"),
        ({"client_secret": "inline"}, "providers.m365.client_secret"),
    ],
)
def test_bad_settings_name_the_key(tmp_path: Path, changes: dict[str, Any], where: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, **changes)
    message = str(caught.value)
    assert where in message and "\n" not in message


@pytest.mark.parametrize("field", ["api_endpoint", "authority"])
@pytest.mark.parametrize(
    "url",
    [
        # The host a reader sees is not the one connected to: the token went elsewhere.
        "https://graph.microsoft.com@evil.example/v1.0",
        "https://graph.microsoft.com:x@evil.example",
        "https://graph.microsoft.com\t.evil.example/v1.0",
        "https://graph.microsoft.com\n",
        "https://gr aph.microsoft.com",
        "https://graph.microsoft.com/v1.0?tenant=x",
        "https://graph.microsoft.com/v1.0#x",
        "https://graph.microsoft.com:99999/v1.0",
        "https:///v1.0",
        "https://gräph.example/v1.0",
    ],
)
def test_graph_urls_are_refused_as_the_gmail_ones_are(tmp_path: Path, field: str, url: str) -> None:
    """Only their scheme was checked: `https://graph.microsoft.com@evil.example/v1.0`
    passed, and the bearer token (for `authority`, the client secret or the signed
    assertion) went to evil.example, the part a URL parser reads as the host."""
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, **{field: url})
    message = str(caught.value)
    assert f"providers.m365.{field}" in message and "\n" not in message, message


@pytest.mark.parametrize(
    ("field", "url"),
    [
        ("api_endpoint", "https://graph.microsoft.us/v1.0/"),
        ("api_endpoint", "http://127.0.0.1:8030/v1.0"),
        ("api_endpoint", "https://[::1]:8030/v1.0"),
        ("authority", "https://login.microsoftonline.us/"),
        ("authority", "https://127.0.0.1:8030"),
    ],
)
def test_graph_urls_of_clouds_and_emulators_load(tmp_path: Path, field: str, url: str) -> None:
    assert getattr(load(tmp_path, **{field: url}).providers["m365"], field) == url.rstrip("/")


def test_secret_files_are_checked_for_permissions(tmp_path: Path) -> None:
    names = [name for name, _ in secret_files(load(tmp_path))]
    assert "providers.m365.client_secret_file" in names


def test_build_reads_the_secret_and_touches_no_network(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("s3cret\n", encoding="utf-8")
    # An authority nobody answers at: building must not ask it anything.
    settings = load(tmp_path, authority="https://127.0.0.1:9", user="{from}")
    provider = build_provider(settings, "m365")
    assert isinstance(provider, GraphProvider)
    view = for_job(provider, "Shop <Shop@Example.com>", None)
    assert isinstance(view, GraphMailboxView) and view.mailbox.user == "Shop@Example.com"
    assert for_job(provider, "shop@example.com", None).mailbox is view.mailbox  # type: ignore[attr-defined]
    provider.close()


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "cannot read"),
        ("", "empty"),
        ("\n", "empty"),
        # Saved by a Windows editor, or pasted from a web page: Azure would answer
        # "invalid client secret" at the first send, naming nothing.
        ("\ufeffs3cret\n", "starts with a byte order mark"),
        ("s3cret\u200b\n", "U+200B"),
        ("s3cr\u00a0et\n", "U+00A0"),
    ],
)
def test_an_unreadable_secret_names_the_key(
    tmp_path: Path, content: str | None, problem: str
) -> None:
    if content is not None:
        (tmp_path / "secret").write_text(content, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        build_provider(load(tmp_path), "m365")
    assert str(caught.value).startswith("providers.m365.client_secret_file: ")
    assert problem in str(caught.value)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n", "no PEM private key"),
        ("-----BEGIN PRIVATE KEY-----\nAA==\n-----END PRIVATE KEY-----\n", "no PEM certificate"),
        (
            "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAA==\n-----END ENCRYPTED PRIVATE KEY-----\n"
            "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n",
            "encrypted",
        ),
    ],
)
def test_a_certificate_file_needs_key_and_certificate(
    tmp_path: Path, content: str, problem: str
) -> None:
    (tmp_path / "app.pem").write_text(content, encoding="utf-8")
    settings = load(tmp_path, client_secret_file=None, certificate_file="app.pem")
    with pytest.raises(ConfigError) as caught:
        build_provider(settings, "m365")
    assert str(caught.value).startswith("providers.m365.certificate_file: ")
    assert problem in str(caught.value)
