"""The EP roofline: for any topology (nodes, GPUs per node, NVLink or PCIe, NICs) and workload, the bytes
each link class carries per rank for each dispatch family and the lower-bound dispatch and combine time;
the named GPU/NIC link table; published EP figures as data, each held against its own hardware's bound.

Pure math on core types (the layer contract lets it import only moelab.core): `links` (the table),
`topology` (link figures and where they come from), `traffic` (rows per link, closed form or counted),
`bound` (times), `published` (the tables), `stored` (the bound of a stored case).
"""
