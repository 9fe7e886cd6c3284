"""tilewise: measure the machine, plan a NUMA/chiplet-aware deployment, launch it, run, report."""

__version__ = "0.1.0"
