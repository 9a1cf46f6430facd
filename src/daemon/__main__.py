"""`python -m daemon`: the sendledger command line."""

from daemon.console import main

raise SystemExit(main())
