"""The fidelity oracle: the simulated server (`tests.simulation.server.SimServer`) against
real Redis 7 and Valkey 8, on generated sequences of the calls aiolock's primitives make
(`ops`, `strategies`), each call's reply, every key and the messages published compared
after every call (`backends`, `compare`, `runner`). `python -m tests.fidelity`; see
docs/simulation.md, "Fidelity"."""
