"""The `specfleet` command (`main`): one module per command family (`simulate` and `plan`, `status`,
`profile`), what they share (`common`, `progress`), and `docs_reference`, which writes the guide's
reference pages."""
