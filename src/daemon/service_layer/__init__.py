"""The service layer every door calls: intake, the job and review views, resolve, cancel,
listing and retention (docs/architecture.md "One service layer")."""
