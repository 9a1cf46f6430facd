"""sendledger's test kit: test doubles for code that sends mail through the Gmail API.

- `GmailEmulator`: Google's OAuth token endpoint and the Gmail API paths a sender uses
  (messages.send, list/search, get, profile) on one loopback port, with search index lag
  and an acceptance log where tests count the copies actually accepted;
- `FaultRelay` and `FaultPlan`: an HTTP relay in front of the emulator (or Google) that
  breaks chosen requests before or after the upstream acts on them (see `MODES`);
- `write_service_account` / `write_authorized_user`: credential files google-auth accepts,
  pointing at the emulator's token endpoint.
- `SmtpFaultRelay` (`testkit.smtp_relay`): the same faults at an SMTP submission's end of DATA,
  per message on kept connections, any command answered by the relay itself (`answer`)
  and every connection closed at once (`hang_up`);
- `testkit.mailservers`: private Postfix + Dovecot instances on loopback (Linux, root), with
  `missing_reason()` saying in one line why they cannot run.

The package stands alone: it imports nothing from the daemon, the ledger or the policies,
so your own tests can use it without starting sendledger.
"""

from __future__ import annotations

from testkit.credentials import write_authorized_user, write_service_account
from testkit.gmail_emulator import ApiError, GmailEmulator
from testkit.relay import KINDS, MODES, FaultPlan, FaultRelay, Kind, Mode, check_mode, classify
from testkit.smtp_relay import SMTP_MODES, SmtpFaultRelay, SmtpMode

__all__ = [
    "KINDS",
    "MODES",
    "SMTP_MODES",
    "ApiError",
    "FaultPlan",
    "FaultRelay",
    "GmailEmulator",
    "Kind",
    "Mode",
    "SmtpFaultRelay",
    "SmtpMode",
    "check_mode",
    "classify",
    "write_authorized_user",
    "write_service_account",
]
