"""The HTTP API, the Prometheus metrics, /healthz and the review page (docs/http-api.md "HTTP API").

FastAPI, uvicorn, prometheus-client and Jinja2 are imported only inside this package, and
this package only when `[api] listen` is set or `sendledger api` runs.
"""
