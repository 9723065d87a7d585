"""``rayaccel doctor``: one row per node and check, ok / warn / fail / n/a, with what to do.

Two halves, so the node agent imports only what runs on its node:

* :mod:`.doctor_node`: :func:`node_facts`, what a node agent gathers on its node (versions, hook,
  unhooked workers, its NVLink domain, the hardware checks of :func:`rayaccel.doctor.local_checks`);
* :mod:`.doctor_cluster`: :func:`run`, what the driver computes across the nodes (versions agree,
  plain-Ray nodes, records, agents, pending requests, NVLink domains) from the agents' answers.

This module names both, for callers of ``rayaccel.ray.doctor``.
"""

from __future__ import annotations

from .doctor_cluster import PENDING_S, Row, domain_rows, run, version_rows
from .doctor_node import node_facts

__all__ = ["PENDING_S", "Row", "domain_rows", "node_facts", "run", "version_rows"]
