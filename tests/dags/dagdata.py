"""Paths and the tiny data set of the DAG tests, shared by `conftest.py` and the test modules (a module of its own:
`from conftest import ...` is ambiguous in a full run, where several conftest modules exist)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DAGS = REPO / "dags"
SAMPLE = REPO / "streamdi" / "sample"

# Brokers (job code 314) and other employees of the tiny Batch1 HR.csv: DimBroker must hold exactly the brokers.
HR_LINES = [
    "101,100,Ada,Lovelace,,314,Branch A,OFFICE1,(555) 100-0001",
    "102,100,Alan,Turing,M,314,Branch A,OFFICE2,(555) 100-0002",
    "103,101,Grace,Hopper,,314,Branch B,OFFICE3,(555) 100-0003",
    "104,100,Edsger,Dijkstra,W,535,Branch B,OFFICE4,(555) 100-0004",
    "100,100,Barbara,Liskov,,100,Head Office,OFFICE0,(555) 100-0000",
]
BROKERS = 3

# New customers of the tiny Batch2 (Customer.txt, CDC inserts), dripped in two pieces of two lines each.
CUSTOMER_IDS = [501, 502, 503, 504]
