"""A broken policy file refuses its own channel only (docs/policies.md "Channel policies"):
`load_policy_dir_partial`, and the servers' `PolicyWatch` that notices a file change."""

from __future__ import annotations

from pathlib import Path

from daemon.config.settings import settings_from_dict
from daemon.service_layer.doors import PolicyWatch, command_policies
from policies.loader import load_policy_dir_partial

GOOD = (
    'provider = "support"\nfrom = "Support <support@example.com>"\n'
    'message_id_domain = "m.example.com"\n'
)


def folder(tmp_path: Path, **files: str) -> Path:
    directory = tmp_path / "policies"
    directory.mkdir(exist_ok=True)
    for name, text in files.items():
        (directory / f"{name}.toml").write_text(text, encoding="utf-8")
    return directory


def test_each_broken_file_refuses_its_channel_and_the_rest_load(tmp_path: Path) -> None:
    directory = folder(
        tmp_path,
        receipts=GOOD,
        alerts=GOOD + "max_attempts = 0\n",
        syntax="not = [toml",
        renamed=GOOD + 'channel = "legal"\nmax_attempts = "x"\n',
        twin=GOOD + 'channel = "receipts"\n',
    )
    partial = load_policy_dir_partial(directory)
    assert set(partial.broken) == {"alerts", "syntax", "legal", "receipts"}
    assert "max_attempts" in str(partial.broken["alerts"][0])
    # A channel declared twice is broken whole: neither file's policy is used.
    assert "receipts" not in partial.policies
    assert len(partial.problems) == sum(len(p) for p in partial.broken.values())


def test_an_unknown_provider_breaks_only_that_channel(tmp_path: Path) -> None:
    directory = folder(tmp_path, receipts=GOOD, other=GOOD.replace("support", "nope", 1))
    partial = load_policy_dir_partial(directory, known_providers={"support"})
    assert set(partial.policies) == {"receipts"} and set(partial.broken) == {"other"}


def settings(tmp_path: Path) -> object:
    (tmp_path / "sa.json").write_text("{}")
    return settings_from_dict(
        {
            "store": {"url": "sqlite:///ledger.sqlite"},
            "daemon": {"policies_dir": "policies"},
            "providers": {"support": {"credentials_file": "sa.json"}},
        },
        config_path=tmp_path / "sendledger.toml",
    )


def test_the_watch_sees_a_file_break_and_heal(tmp_path: Path) -> None:
    directory = folder(tmp_path, receipts=GOOD, alerts=GOOD)
    loaded = settings(tmp_path)
    current = command_policies(loaded).policies  # type: ignore[arg-type]
    watch = PolicyWatch(loaded, lambda: current)  # type: ignore[arg-type]
    assert watch().broken == {} and set(watch().policies) == {"receipts", "alerts"}
    (directory / "alerts.toml").write_text(GOOD + "max_attempts = 0\nretry_backoff = '1s'\n")
    assert set(watch().broken) == {"alerts"}
    (directory / "alerts.toml").write_text(GOOD)
    assert watch().broken == {}


def test_without_a_set_in_force_the_watch_is_the_folder_as_a_command_reads_it(
    tmp_path: Path,
) -> None:
    """`sendledger api`'s view: a file added or edited is in force at once (as `submit`
    reads it), nothing is "added since the last reload", and a folder that cannot be read
    refuses the channels it last held, naming why."""
    directory = folder(tmp_path, receipts=GOOD)
    watch = PolicyWatch(settings(tmp_path), None)  # type: ignore[arg-type]
    assert set(watch().policies) == {"receipts"}
    (directory / "alerts.toml").write_text(GOOD)
    view = watch()
    assert set(view.policies) == {"receipts", "alerts"} and view.unloaded == frozenset()
    edited = GOOD.replace("m.example.com", "n.example.com")
    (directory / "alerts.toml").write_text(edited)
    assert watch().policies["alerts"].message_id_domain == "n.example.com"
    directory.rename(tmp_path / "moved")  # the folder gone: it cannot be read
    broken = watch().broken
    assert set(broken) == {"receipts", "alerts"} and "no such directory" in broken["alerts"]
