"""What runs in every worker of a rayaccel node: the hook (:mod:`.hook`, preloaded by the raylet into
every worker; each line costs every task), :func:`~.devices.get_devices`, a gang member's actor
(:mod:`.gang`) and the tiered store inside a worker (:mod:`.store`).

Nothing here starts or stops a node and nothing here is the user's driver API.
"""
