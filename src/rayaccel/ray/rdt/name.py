"""The transport's name, as Ray code passes it: ``@ray.method(tensor_transport="rayaccel")`` (Ray upper-cases it).

A module of its own so that the registration (:mod:`rayaccel.ray.rdt`, standard library only)
and the manager (:mod:`.transport`) share it without importing each other.
"""

NAME = "rayaccel"
