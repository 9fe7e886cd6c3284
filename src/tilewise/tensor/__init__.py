"""The thesis's tensor operators as workloads (thesis 004, ch. 3): T1 DISTINCT cardinality by
bincount, T2 join output cardinality, T3 PageRank by scatter_add, on a tensor runtime (PyTorch,
eager and compiled with torch.compile) on CPU or a CUDA GPU, against the baselines that run here.

data.py (generators), rename.py (tuple renaming, a pure decision), ops.py (the tensor programs),
worker.py (the bound process that runs them), run.py (parameters, spawning, checks, ratios).
"""

WORKLOADS = ("T1", "T2", "T3")
# The relational baseline of T1/T2 (the thesis compared SQL Server), run in-process as a library;
# a variant name, not a deployed engine.
SQL_VARIANT = "duckdb"
DESCRIPTIONS = {"T1": "DISTINCT cardinality by bincount (tensor program)",
                "T2": "join output cardinality by bincount (tensor program)",
                "T3": "PageRank by scatter_add (tensor program)"}


def is_tensor_workload(name: str) -> bool:
    return name.strip().upper() in WORKLOADS
