"""The seam between aiolock and the server(s) of a user's client: the client libraries
(`clients`), the `Backend` every primitive talks through (`backend`), what every transport
shares (`base`) and one transport per topology (`direct`, `sentinel`, `cluster`), a quorum of
independent servers as one backend (`quorum`), and the pub/sub sessions the notifier reads
(`pubsub`, `cluster_pubsub`, `quorum_pubsub`).

Below the public faces, the only floor that imports the client libraries, save
`_ops.doctor` (its checks call redis-py's commands and read its exceptions) and a type-only
import in `_engine.notifier`. Imports: `_aio`, `_lua`, `_model`.
Tests: `tests/integration/test_connections.py`, `tests/unit/test_cluster_pubsub.py`,
`test_pubsub_inbox.py`, and the deployments of `tests/faults/` (cluster, sentinel, quorum).
"""
