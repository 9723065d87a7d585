"""What runs for a node, beside its raylet: how a node starts (:mod:`.start`; ``rayaccel start`` in
:mod:`.lifecycle`; the processes it started, :mod:`.processes`), its private directory
(:mod:`.nodedir`), and its agent (:mod:`.agent`: snapshots, reaping, drains, health in :mod:`.health`,
metrics in :mod:`.metrics`, the node's half of doctor in :mod:`.doctor`).
"""
