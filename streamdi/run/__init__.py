"""What runs the jobs: the top layer of streamdi.

Layers, each importing only the ones below it (checked by tests/unit/test_import_layers.py):

1. `schemas/`: what the data is (declarations, no I/O).
2. `streamdi/` (this package's parent, without `streamdi.run`): the platform. How we talk to Delta (`lake`),
   PostgreSQL (`warehouse`), Spark (`spark`), the landing zone (`collector`), the batch log and the quality suites.
3. `jobs/`: the TPC-DI work. Staging, the transactions T0..T4 and AG, the audit.
4. `streamdi.run` (here), `dags/` and `bench/`: the entry points and the one loop that drives a micro-batch from
   the collector to the migration ledger (`pipeline`), used by the CLI (`cli`), the Airflow tasks
   (`orchestration`) and the stream service (`stream`).
"""
