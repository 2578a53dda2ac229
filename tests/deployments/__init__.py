"""Multi-process deployments built from real server binaries on loopback ports, each torn down
on every path: a Redis Cluster (`cluster`), Sentinel with a replica (`sentinel`), independent
servers for a quorum (`quorum`) and a TCP fault proxy (`proxy`)."""
