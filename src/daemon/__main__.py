"""`python -m daemon`: the sendledger command line."""

from daemon.cli import main

raise SystemExit(main())
