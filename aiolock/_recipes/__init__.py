"""What users build from the primitives: `@locked` (`locked`) and the name templates it
shares with the web integrations (`name_templates`), `run_once` (`run_once`), releasing every
lock on SIGTERM (`shutdown`) and fenced storage in Redis (`fenced_storage`).

Imports: every floor up to `_primitives`. Tests: `tests/usage/`.
"""
