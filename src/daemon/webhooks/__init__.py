"""Webhooks: the outcomes of jobs POSTed to the programs that asked, from the event log
(docs/http-api.md "Webhooks", docs/architecture.md "Webhooks").

- `events`: which job events a webhook hears, by one table;
- `signing`: the Standard Webhooks signature and the `whsec_` secret;
- `delivery`: one HTTP POST, no redirects, with a timeout;
- `worker`: one webhook's delivery from its position in the log (at least once, in log
  order, retried with backoff);
- `delivery_threads`: the worker threads inside the daemon;
- `status` (with `daemon/cli/webhooks.py`): `sendledger webhooks status`.
"""
