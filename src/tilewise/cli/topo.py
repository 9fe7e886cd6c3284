"""`tilewise topo`: show (and export) a topology."""

from __future__ import annotations

import click

from tilewise import topology
from tilewise.cli.common import OUTPUT_FILE, console, emit_json, json_option, topology_option
from tilewise.topology import hwloc_xml, render


INDEX_LEGEND = "indexes: L# logical (hwloc's order), P# OS; cpu lists are OS CPU numbers (P#)"


@click.command("topo")
@topology_option
@json_option
@click.option("--export", "export_path", type=OUTPUT_FILE, help="Write the topology as hwloc 2.x XML.")
@click.option("--measure", is_flag=True,
              help="Measure core-to-core latency and bandwidth here and keep them with the topology (and in --export).")
@click.option("--measure-memory", is_flag=True,
              help="Measure idle latency and read bandwidth from every node with CPUs to every memory node here and "
                   "keep them with the topology (hwloc memattrs, in --export too); tiers and placement then use them.")
def topo(topology_src, as_json, export_path, measure, measure_memory):
    """Show packages, NUMA nodes (CPU-less ones too), L3 domains (chiplets), cores, SMT, distances."""
    t = topology.load(topology_src)
    if topology.is_live(t) and t.gpus:
        from tilewise import devices

        t = devices.with_nvml(t)  # names, memory, UUIDs of this machine's GPUs where a driver is loaded
    notes: list[str] = []
    if measure:
        from tilewise.probes.matrix import measure_into

        notes = measure_into(t, report=lambda m: console(stderr=True).print(m, markup=False))
    if measure_memory:
        from tilewise.probes import memory

        notes += memory.measure_into(t, report=lambda m: console(stderr=True).print(m, markup=False))
    if export_path:
        hwloc_xml.save(t, export_path)
    if as_json:
        doc = render.to_json(t)
        if export_path:
            doc["exported_to"] = export_path
        if measure or measure_memory:
            doc["measure_notes"] = notes
        emit_json(doc)
        return
    lines = render.tree_lines(t) + [render.summary_line(t), INDEX_LEGEND] + render.note_lines(t) + notes  # plain text: no rich import here
    if export_path:
        lines.append(f"exported hwloc XML to {export_path}")
    click.echo("\n".join(lines))
