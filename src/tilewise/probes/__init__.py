"""Hardware probes (paper 001, section 2): core-to-core latency and bandwidth, STREAM per layout.

``pairs``   pure functions: pair classes by topology, pair sampling, grouping a matrix by topology
``matrix``  running tw_latency / tw_bandwidth over pairs and assembling matrices
``stream``  running tw_stream as N processes placed by a tilewise plan
``output``  result documents (versioned JSON), CSV and PNG plots
"""
