"""What a task asks for: :class:`Request`.

A request is validated when it is built; an invalid one raises
:class:`~rayaccel.errors.RequestError` naming the field and the allowed values.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import RequestError
from ..units import format_bytes, parse_bytes

#: Allowed values of :attr:`Request.interconnect`: ``"direct"`` is the general name of "every pair
#: directly linked" (NVLink, xGMI, NeuronLink); ``"nvlink"`` is accepted as a synonym.
INTERCONNECTS = ("any", "direct", "nvlink")
#: The values of :attr:`Request.interconnect` that ask for direct links (:attr:`Request.direct`).
DIRECT = ("direct", "nvlink")


@dataclass(frozen=True, slots=True)
class Request:
    """A placement request on one node.

    Semantics:
        * ``gpus=k`` (exclusive, the default): ``k`` whole devices.
        * ``mig="3g.40gb"``: one free MIG instance of that profile (``gpus`` 0 or 1).
        * ``gpu_memory=X, exclusive=False``: share one device by memory, best-fit
          packing, never oversubscribing (``gpus`` 0 or 1).
        * ``gpu_memory=X, exclusive=True``: ``gpus`` whole devices each with at
          least ``X`` bytes of memory.
        * ``required=(4, 5)`` (whole devices only): the chosen set contains devices
          4 and 5, or the answer is a :class:`~rayaccel.placement.Rejection` saying
          which of them is busy or why no set with them meets the request (as
          go-gpuallocator's ``Allocate(available, required, size)``).
        * ``near=(3,)`` (whole devices only, a soft preference): data already sits on
          device 3 of the node, so among sets tied on criteria 1-3 the one with the
          lowest modeled cost of bringing that data to the set
          (:func:`rayaccel.transfer.locality_cost`, 1 GiB per near device) wins, before
          fragmentation. With ``near_node``, the cluster placer also prefers that node.

    Attributes:
        gpus: number of whole devices (0 only with ``mig`` or shared ``gpu_memory``).
        mig: MIG profile name, e.g. ``"3g.40gb"``, or None.
        gpu_memory: bytes (int, or a string such as ``"20GiB"`` which is parsed), or None.
        interconnect: ``"any"``, or ``"direct"``: every chosen pair directly linked, GPU to
            GPU (NVLink, AMD xGMI or AWS NeuronLink alike). ``"nvlink"`` is a synonym of
            ``"direct"`` (the older name; it too accepts xGMI and NeuronLink). Kept as given.
        same_numa: all chosen devices on one NUMA node.
        vendor: only devices of this vendor (``"nvidia"``, ``"amd"``...), or None.
        model: only devices whose model contains this text (case-insensitive), or None.
        nic: a GPUDirect-capable (RDMA) NIC with a PIX/PXB path to the set is required.
        exclusive: whole devices (True) or sharing by memory (False).
        required: device indices (on the node being placed on) the set must contain;
            given as any iterable of ints, stored as a sorted tuple. At most ``gpus``,
            no duplicates. A required index the node lacks raises
            :class:`~rayaccel.errors.RequestError` when placing; a required device that
            is busy, failed or otherwise not eligible gives a Rejection.
        near: device indices holding the task's input data (sorted tuple, no
            duplicates; busy devices allowed: the data stays where it is). A soft
            preference, see above; indices the node lacks raise RequestError.
        near_node: the node id holding the ``near`` devices, or None for "the node
            being placed on". :func:`~rayaccel.placement.place` ranks that node first
            among nodes that offer their type's best interconnect (for one device: among
            all nodes); on the other nodes ``near`` is ignored (the data crosses nodes
            whichever device is chosen).

    Raises:
        RequestError: on construction, naming the bad field and the allowed values.
    """

    gpus: int = 1
    mig: str | None = None
    gpu_memory: int | str | None = None
    interconnect: str = "any"
    same_numa: bool = False
    vendor: str | None = None
    model: str | None = None
    nic: bool = False
    exclusive: bool = True
    required: tuple[int, ...] = ()
    near: tuple[int, ...] = ()
    near_node: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int):
            raise RequestError(f"expected an int, got {self.gpus!r}", "gpus", "an int >= 0")
        if self.gpus < 0:
            raise RequestError(f"must be >= 0, got {self.gpus}", "gpus", "an int >= 0")
        if self.gpu_memory is not None:
            mem = parse_bytes(self.gpu_memory, "gpu_memory")
            if mem <= 0:
                raise RequestError("must be > 0", "gpu_memory", "a positive size such as '20GiB'")
            object.__setattr__(self, "gpu_memory", mem)
        if self.interconnect not in INTERCONNECTS:
            raise RequestError(f"unknown value {self.interconnect!r}", "interconnect", ", ".join(INTERCONNECTS))
        for name in ("same_numa", "nic", "exclusive"):
            if not isinstance(getattr(self, name), bool):
                raise RequestError(f"expected True or False, got {getattr(self, name)!r}", name, "True, False")
        for name in ("mig", "vendor", "model"):
            val = getattr(self, name)
            if val is not None and (not isinstance(val, str) or not val.strip()):
                raise RequestError(f"expected a non-empty string, got {val!r}", name, "a string or None")
        if self.mig is not None:
            if self.gpus > 1:
                raise RequestError(f"a MIG request takes one instance, got gpus={self.gpus}", "gpus", "0 or 1 with mig")
            if self.gpu_memory is not None or not self.exclusive:
                raise RequestError("cannot be combined with mig", "gpu_memory" if self.gpu_memory is not None else "exclusive",
                                   "mig alone, or gpu_memory without mig")
        elif not self.exclusive:
            if self.gpu_memory is None:
                raise RequestError("a shared request (exclusive=False) needs gpu_memory", "gpu_memory", "a size such as '20GiB'")
            if self.gpus > 1:
                raise RequestError(f"a shared request uses one device, got gpus={self.gpus}", "gpus", "0 or 1 with exclusive=False")
        elif self.gpus == 0:
            raise RequestError("0 devices asked", "gpus", "an int >= 1, or 0 with mig or with gpu_memory and exclusive=False")
        if (self.interconnect != "any" or self.same_numa or self.nic) and self.kind != "devices":
            raise RequestError("only applies to whole-device requests", "interconnect" if self.interconnect != "any"
                               else ("same_numa" if self.same_numa else "nic"), "its default with mig or shared memory")
        for name in ("required", "near"):
            object.__setattr__(self, name, _index_tuple(getattr(self, name), name))
        if self.near_node is not None and (not isinstance(self.near_node, str) or not self.near_node.strip()):
            raise RequestError(f"expected a node id (non-empty string) or None, got {self.near_node!r}", "near_node",
                               "a node id or None")
        if (self.required or self.near or self.near_node is not None) and self.kind != "devices":
            name = "required" if self.required else ("near" if self.near else "near_node")
            raise RequestError("only applies to whole-device requests", name, "() with mig or shared memory")
        if self.near_node is not None and not self.near:
            raise RequestError("names the node holding the near devices, but near is empty", "near_node",
                               "None, or near=(device indices on that node,)")
        if len(self.required) > self.gpus:
            raise RequestError(f"{len(self.required)} devices required but gpus={self.gpus}", "required",
                               f"at most gpus={self.gpus} indices (or raise gpus)")

    @property
    def direct(self) -> bool:
        """True when every chosen pair must be directly linked (``interconnect`` ``"direct"`` or ``"nvlink"``)."""
        return self.interconnect in DIRECT

    @property
    def kind(self) -> str:
        """``"devices"`` (whole devices), ``"mig"`` (one MIG instance) or ``"shared"`` (memory on one device)."""
        if self.mig is not None:
            return "mig"
        if not self.exclusive:
            return "shared"
        return "devices"

    def describe(self) -> str:
        """A short human form, e.g. ``"4 GPUs, direct, same NUMA"`` (``interconnect`` as given)."""
        if self.kind == "mig":
            parts = [f"1 MIG instance {self.mig}"]
        elif self.kind == "shared":
            parts = [f"{format_bytes(self.gpu_memory)} of one shared device"]  # type: ignore[arg-type]
        else:
            parts = [f"{self.gpus} GPU{'s' if self.gpus != 1 else ''}"]
            if self.gpu_memory is not None:
                parts.append(f">= {format_bytes(self.gpu_memory)} each")  # type: ignore[arg-type]
        if self.interconnect != "any":
            parts.append(self.interconnect)
        if self.same_numa:
            parts.append("same NUMA")
        if self.nic:
            parts.append("near an RDMA NIC")
        if self.vendor:
            parts.append(f"vendor {self.vendor}")
        if self.model:
            parts.append(f"model ~{self.model!r}")
        if self.required:
            parts.append("with " + ", ".join(map(str, self.required)))
        if self.near:
            parts.append("near " + ", ".join(map(str, self.near)) + (f" on {self.near_node}" if self.near_node else ""))
        return ", ".join(parts)


def _index_tuple(values, name: str) -> tuple[int, ...]:
    """``values`` (ints, any iterable) as a sorted tuple; RequestError on non-ints, negatives or duplicates."""
    if isinstance(values, tuple) and all(type(v) is int and v >= 0 for v in values) and \
            all(values[i] < values[i + 1] for i in range(len(values) - 1)):
        return values
    if isinstance(values, (str, bytes)) or isinstance(values, int):
        raise RequestError(f"expected device indices (a tuple of ints), got {values!r}", name, "e.g. (4, 5)")
    try:
        items = list(values)
    except TypeError:
        raise RequestError(f"expected device indices (a tuple of ints), got {values!r}", name, "e.g. (4, 5)") from None
    for v in items:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise RequestError(f"expected device indices (ints >= 0), got {v!r}", name, "e.g. (4, 5)")
    seen: set[int] = set()
    dups = sorted({v for v in items if v in seen or seen.add(v)})  # type: ignore[func-returns-value]
    if dups:
        raise RequestError(f"device {dups[0]} named twice", name, "each device index once")
    return tuple(sorted(items))


def make_request(request: Request | None = None, **fields) -> Request:
    """``request`` as is, or a :class:`Request` built from ``fields`` (not both).

    With ``required`` and no ``gpus`` among the fields (whole devices), ``gpus`` is
    the number of required devices: ``plan(t, required=(4, 5))`` asks for 4 and 5.

    Raises:
        RequestError: both given, an unknown field, or a bad value.
    """
    if request is not None:
        if fields:
            raise RequestError(f"give either a Request or fields, not both (got {sorted(fields)})", "request")
        if not isinstance(request, Request):
            raise RequestError(f"expected a Request, got {type(request).__name__}", "request")
        return request
    allowed = set(Request.__dataclass_fields__)
    unknown = sorted(set(fields) - allowed)
    if unknown:
        raise RequestError(f"unknown field {unknown[0]!r}", unknown[0], ", ".join(sorted(allowed)))
    req = fields.get("required")
    if req and "gpus" not in fields and not fields.get("mig") and fields.get("gpu_memory") is None \
            and isinstance(req, (tuple, list, set, frozenset)):
        fields = {**fields, "gpus": len(req)}
    return Request(**fields)
