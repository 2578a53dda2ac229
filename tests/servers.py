"""The test suite's servers are the public helpers of `aiolock.testing`."""

from aiolock.testing import RedisServer, ServerBinary, find_binaries

__all__ = ("RedisServer", "ServerBinary", "find_binaries")
