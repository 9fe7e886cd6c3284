"""Hardware probes (paper 001, section 2): core-to-core latency and bandwidth, STREAM per layout;
the memory matrix (thesis 004, ch. 4).

``pairs``   pure functions: pair classes by topology, pair sampling, grouping a matrix by topology
``matrix``  running tw_latency / tw_bandwidth over pairs and assembling matrices
``stream``  running tw_stream as N processes placed by a tilewise plan
``memory``  the initiator x target memory matrix (tw_memory; thesis 004, ch. 4)
``output``  result documents (versioned JSON), CSV and PNG plots
"""
