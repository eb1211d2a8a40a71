"""What every other package may use and that knows nothing of them: exit codes and the one user-error type
(errors), how a line reaches a person (console), rank helpers (distributed), process lifetime, HF_HOME and
"local, remote or hub" (hf), the Hub token, the URL grammar of stores (urls), writable-directory checks
(writable), the library versions (versions) and the launcher's hand-off to the ranks (handoff)."""
