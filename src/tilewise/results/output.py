"""Writing a results document: the JSON, then the CSV files and plots the reporting module makes
from it, into an output folder checked before the first measurement (hyperfine's rule: a bad path
fails early; every write is atomic and repeated after each case, so a late failure loses nothing).

Files a kind owns that the current document does not produce (no rows yet, an interrupted run)
are removed, so a folder never shows an older run's table or plot beside this run's results.

A document that grows record by record while it is measured (the elastic daemon's log, ten records
a second for hours) is written as JSON lines by ``LineWriter`` instead: rewriting it whole after
each record would cost more the longer it runs; appending a flushed line costs the same each time,
and a crash loses at most the line being written (``model.load`` reads what was written before).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tilewise import fsutil
from tilewise.errors import TilewiseError, UsageError
from tilewise.results import report


class Writer:
    def __init__(self, out_dir: str | os.PathLike | None, *, name: str = "results.json", csv: bool = True,
                 plots: bool = True) -> None:
        """out_dir None: nothing is written (commands whose --out is optional)."""
        self.dir = fsutil.ensure_writable_dir(out_dir) if out_dir is not None else None
        self.name = name
        self.csv = csv
        self.plots = plots
        self.written: list[str] = []
        self.plot_paths: list[Path] = []

    @property
    def json_path(self) -> Path | None:
        return None if self.dir is None else self.dir / self.name

    def _done(self, p: Path) -> None:
        if str(p) not in self.written:
            self.written.append(str(p))

    def checkpoint(self, doc: dict) -> dict:
        """Between a run's steps: derive the metrics and write the JSON alone (a late failure loses
        nothing); the CSV files and plots are made once, by write() at the end, or by `tilewise
        report` from what was written when the run never got there (kill -9)."""
        report.prepare(doc)
        if self.dir is not None:
            self._write_json(doc)
        return doc

    def write(self, doc: dict, *, plots: bool | None = None) -> dict:
        """Derive the metrics, make the CSV files and (unless plots=False) the plots, then write the
        JSON once, naming the plots."""
        report.prepare(doc)
        if self.dir is None:
            return doc
        produced = set()
        try:
            if self.csv:
                for fname, text in report.csv_files(doc).items():
                    self._done(fsutil.atomic_write(self.dir / fname, text))
                    produced.add(fname)
        except OSError as e:
            raise TilewiseError(f"cannot write results to {self.dir}: {e.strerror or e}") from None
        if plots if plots is not None else self.plots:
            try:
                self.plot_paths = report.plot_files(doc, self.dir)
            except Exception as e:  # a plot is a report, never a reason to lose a run
                doc.setdefault("warnings", []).append(f"plots not written: {e}")
                self.plot_paths = []
            for p in self.plot_paths:
                self._done(p)
                produced.add(Path(p).name)
            doc["plots"] = [str(p) for p in self.plot_paths]
        else:
            self.plot_paths = []
            doc.pop("plots", None)
        self._write_json(doc)
        self._remove_stale(doc, produced)
        return doc

    def _write_json(self, doc: dict) -> None:
        try:
            self._done(fsutil.atomic_write_json(self.dir / self.name, doc, default=str))
        except OSError as e:
            raise TilewiseError(f"cannot write results to {self.dir}: {e.strerror or e}") from None

    def _remove_stale(self, doc: dict, produced: set[str]) -> None:
        for fname in report.owned_files(doc):
            if fname in produced:
                continue
            try:
                (self.dir / fname).unlink()
            except OSError:
                pass
            if str(self.dir / fname) in self.written:
                self.written.remove(str(self.dir / fname))


class LineWriter:
    """A results document as JSON lines: `header` (the envelope, model.new) on the first line, then
    one record per `write`, each flushed. The file is opened (and the header written) when the
    writer is made, so a bad path fails before the first measurement; path None writes nothing."""

    def __init__(self, path: str | os.PathLike | None, header: dict | None = None, *, what: str = "--log") -> None:
        self.path = path
        self.f = None
        if path is None:
            return
        self.what = what
        try:
            self.f = open(path, "w")
        except OSError as e:
            raise UsageError(f"cannot write {what} {path}: {e.strerror}") from None
        self.write(header if header is not None else {})

    def write(self, rec: dict) -> None:
        if self.f is not None:
            try:
                self.f.write(json.dumps(rec, default=str) + "\n")
                self.f.flush()
            except OSError as e:  # a file that opens but takes nothing (/proc/version, a full disk)
                f, self.f = self.f, None
                try:
                    f.close()
                except OSError:
                    pass
                raise UsageError(f"cannot write {self.what} {self.path}: {e.strerror or e}") from None

    __call__ = write

    def close(self) -> None:
        if self.f is not None:
            self.f.close()
            self.f = None

    def __enter__(self) -> LineWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
