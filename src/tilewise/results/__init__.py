"""One results model for every measurement tilewise makes, one module per result kind.

- ``results.model``: the versioned document (``new``, ``metric``, ``finish``, ``load`` with
  upgrade-on-load, ``with_metrics``); ``results.document``: its envelope, typed (``Document``, which
  every kind's document derives from).
- ``results.kinds``: one module per kind (tpch, elastic, elastic.log, elastic.tick, the probes,
  workload, tune, overhead): its typed body, metrics, tables, CSV, plots and older formats.
- ``results.stats``: n, min/median/max, mean, stdev (None with one value), 95 % CI, outliers,
  percentiles, ratio of two samples with its interval: the one place statistics are computed.
- ``results.report``: dispatch to the kinds (tables on a console passed in, CSV text, plots), and
  ``compare`` for `tilewise report DIR...`.
- ``results.output``: ``Writer`` writes a document and its CSV and plots into an output folder;
  ``LineWriter`` writes a growing document (a log) as JSON lines.
"""

from tilewise.results.model import FORMAT, VERSION, finish, load, metric, new, upgrade, with_metrics  # noqa: F401
