"""Deterministic simulation of aiolock's real client: a seeded event loop with virtual time
(`loop`), simulated Redis servers at the transport seam that run the project's own scripts
(`server`), simulated processes and faults (`world`), the scenarios judged by the safety
checker's judge (`scenarios`) and planted bugs (`mutants`). The entry is
`python -m tests.simulate`; docs/simulation.md says what is simulated and what is not."""
