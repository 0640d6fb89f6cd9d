"""streamdi: TPC-DI as a stream of ordered micro-batches (landing -> Delta -> PostgreSQL)."""

__version__ = "0.1.0"
