"""What runs in the user's driver (and the CLI): :func:`~.init.init` / ``shutdown``, ``rayaccel.remote``
(:mod:`.tasks`, through :mod:`.claim`), gangs (:mod:`.gangs`, :mod:`.places`), the cluster as a driver sees
it (:mod:`.view`), ``status`` / operator actions / doctor across nodes (:mod:`.status`, :mod:`.ops`,
:mod:`.doctor`) and :class:`~.cluster.SimulatedCluster`.
"""
