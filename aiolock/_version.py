__version__ = "0.1.0.dev0"

DISTRIBUTION = "aiolock-redis"
"""The package's name on the index (`pip install aiolock-redis`); it is imported as
`aiolock`."""
