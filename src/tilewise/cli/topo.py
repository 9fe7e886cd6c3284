"""`tilewise topo`: show (and export) a topology."""

from __future__ import annotations

import click

from tilewise import topology
from tilewise.cli.common import console, emit_json, json_option, topology_option
from tilewise.topology import hwloc_xml, render


@click.command("topo")
@topology_option
@json_option
@click.option("--export", "export_path", metavar="FILE", help="Write the topology as hwloc 2.x XML.")
def topo(topology_src, as_json, export_path):
    """Show packages, NUMA nodes (CPU-less ones too), L3 domains (chiplets), cores, SMT, distances."""
    t = topology.load(topology_src)
    if export_path:
        hwloc_xml.save(t, export_path)
    if as_json:
        doc = render.to_json(t)
        if export_path:
            doc["exported_to"] = export_path
        emit_json(doc)
        return
    out = console()
    for line in render.tree_lines(t):
        out.print(line, markup=False)
    out.print(render.summary_line(t), markup=False)
    if export_path:
        out.print(f"exported hwloc XML to {export_path}", markup=False)
