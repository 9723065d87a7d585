"""The node arbiter: which physical units stand behind the slots Ray grants (no ``ray`` import).

* :mod:`.state` -- the shared formats, typed: the arbiter's state, a holder, the agent's snapshot,
  the one device-state classification;
* :mod:`.table` -- the node table a worker reads (units, CPUs, NICs, precomputed plans);
* :mod:`.decide` -- the grant decision and the other transitions, pure functions;
* :mod:`.statefile` -- :class:`~.statefile.Arbiter`: the state file and the node lock around them;
* :mod:`.choose` / :mod:`.placer` -- choosing units (the table's plans, else the placer);
* :mod:`.build` -- the node table built at node start.

Importing this package imports none of its modules: a Ray worker loads only what its grant needs.
"""
