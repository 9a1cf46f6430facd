"""Commands that run the daemon against a mailbox to show or check the method: ``demo``
(the emulator, with faults) and ``probe`` (the user's own mailbox)."""
