"""A host's config for the command line tests: a `receipts` policy, a Gmail provider
whose credentials are never read (no command here calls it) and the store."""

from __future__ import annotations

from pathlib import Path


def write_host_config(folder: Path, store_url: str, *, name: str | None = None) -> Path:
    """The config file written in `folder` (its policies and credentials beside it),
    `daemon.name` set when `name` is."""
    (folder / "policies").mkdir(parents=True)
    (folder / "policies" / "receipts.toml").write_text(
        'provider = "support"\nfrom = "Support <support@example.com>"\n'
        'message_id_domain = "mail.example.com"\non_unknown = "review"\n'
    )
    (folder / "sa.json").write_text("{}")
    named = f'name = "{name}"\n' if name is not None else ""
    config = folder / "sendledger.toml"
    config.write_text(
        f'[store]\nurl = "{store_url}"\n[daemon]\n{named}policies_dir = "policies"\n'
        '[providers.support]\ncredentials_file = "sa.json"\n'
    )
    return config
