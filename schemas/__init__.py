"""Declared schemas: every source file, staging table and warehouse table is described once here.

The parser (`jobs.stage`), the Delta tables (`streamdi.lake`), the PostgreSQL DDL (`streamdi.warehouse`),
the generator and the test-data builders all derive from these declarations.
"""

from schemas.model import Column, SourceFile, Table

__all__ = ["Column", "SourceFile", "Table"]
