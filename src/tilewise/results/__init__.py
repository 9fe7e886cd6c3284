"""One results model for every measurement tilewise makes, and one reporting module.

- ``results.model``: the versioned document (``new``, ``metric``, ``finish``, ``load`` with
  upgrade-on-load, ``with_metrics``).
- ``results.stats``: n, min/median/max, mean, stdev (None with one value), 95 % CI, outliers,
  ratio of two samples with its interval.
- ``results.report``: tables (on a console passed in), CSV text, plots, and ``compare`` for
  `tilewise report DIR...`.
- ``results.output.Writer``: writes a document and its CSV and plots into an output folder.
"""

from tilewise.results.model import FORMAT, VERSION, finish, load, metric, new, upgrade, with_metrics  # noqa: F401
