"""`tilewise data layout` and cracking: which layout of external data a workload and a deployment
need, measured on this machine (thesis 004, ch. 5, "serverless cracking").

- workload.py: the statements and the columns their predicates filter on (sqlglot), the sort column;
- candidates.py: the layouts worth measuring for a data set, a workload and a plan (pure);
- advise.py: break-even and the recommendation with its reasons, on recorded measurements (pure);
- measure.py: per layout and query: time, bytes read from storage (/proc/<pid>/io with the page
  cache dropped per file or system-wide) and CPU-seconds;
- session.py: the `data layout` use case, run(config, reporter) -> the "layout" results document;
- crack.py: transforming the tables of a running deployment in the background, on the cores the
  elastic allocator leaves idle, switching each table when its copy is checked (`tilewise up --crack`);
- route.py: a two-copy layout's choice per query (the sorted copy for queries that filter on its column).
"""
