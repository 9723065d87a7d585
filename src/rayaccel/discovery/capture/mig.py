"""``nvidia-smi mig`` tables: ``-lgip``, ``-lgipp``, ``-lgi`` (and ``-lcip``, rejected).

* ``-lgip`` (GPU instance profiles): one :class:`MigProfile` per row and GPU:
  ``max_instances`` = the *Total* of Free/Total, ``memory_mib`` = GiB x 1024
  rounded, ``sms`` = the SM column. ``-lgip`` has no placements, so they are
  inferred -- conservatively -- as ``{0, s, 2s, ...}`` (``max_instances`` starts
  of ``s`` slots, ``s`` from the memory share of the largest profile over 8
  slices, or over ``<g>`` slices when the largest profile is smaller than 7g,
  e.g. A30's 4 slices), and a warning says so. Each inferred start is a valid
  one on A100/H100/H200/A30; some valid starts are missed (``+me`` profiles).
* ``-lgipp`` placement lines ``GPU 0 Profile ID 19 Placements: {0,...,6}:1``
  give the exact placements and slot size; they override inferred ones when
  combined with ``-lgip`` (in one text or as separate captures). ``-lgipp``
  alone gives per-profile-id placements: the profiles are named from the GPU's
  model when another capture names it (``nvidia-smi -L``) and the catalog has
  its MIG table (a catalog profile with that id *and* that slot size), else
  kept under the name ``#<id>`` (which no request names) with a warning; see
  :func:`placement_profiles`.
* ``-lgi`` (GPU instances): one :class:`Partition` per row with ``gi_id`` and
  ``start``/``size`` (placement ``start:size``).
* ``-lcip``/``-lci`` (compute instances inside one GPU instance) are rejected
  with a :class:`CaptureError`: rayaccel schedules GPU instances, and a
  compute-instance table does not say which GPU instances exist.

The MIG tables do not necessarily list every GPU of a node (only MIG-enabled
ones), so their fragments never define the device count on their own.
"""

from __future__ import annotations

import re

from ...catalog import mig_table
from ...errors import CatalogError
from ...topology import MigProfile, Partition
from ._base import Fragment, Line, fail, find_hostname

FORMAT_LGIP = "nvidia-smi mig -lgip"
FORMAT_LGIPP = "nvidia-smi mig -lgipp"
FORMAT_LGI = "nvidia-smi mig -lgi"

_LGIP_TITLE = re.compile(r"GPU instance profiles:")
_LGI_TITLE = re.compile(r"GPU instances:")
_CI_TITLE = re.compile(r"Compute instance(?: profile)?s:")
_PLACEMENT = re.compile(
    r"^\s*GPU\s+(\d+)\s+Profile\s+ID\s+(\d+)\s+Placements?\s*:\s*\{([\d,\s]*)\}\s*:\s*(\d+)(?:\s+MIG\s+(\S+))?")
_PLACEMENT_LOOSE = re.compile(r"^\s*GPU\s+\d+\s+Profile\s+ID\b")
_ROW = re.compile(r"^\s*\|\s*(\d+)\s+MIG\s+(\S.*?)\s*\|\s*$")
_FREE_TOTAL = re.compile(r"^(\d+)/(\d+)$")
_GEOM = re.compile(r"^(\d+)g\.")


def detect(lines: list[Line]) -> bool:
    """True for a MIG profile, placement, instance or compute-instance table."""
    for ln in lines:
        t = ln.text
        if _LGIP_TITLE.search(t) or _LGI_TITLE.search(t) or _CI_TITLE.search(t) or _PLACEMENT.match(t):
            return True
    return False


def parse(lines: list[Line], path: str) -> list[Fragment]:
    """Profiles, placements and/or GPU instances.

    Raises:
        CaptureError: a compute-instance table, or a table row that cannot be read.
    """
    host = find_hostname(lines)
    for ln in lines:
        if _CI_TITLE.search(ln.text):
            raise fail("this is a MIG compute-instance table (`nvidia-smi mig -lcip`/`-lci`); rayaccel imports "
                       "GPU-instance profiles (`nvidia-smi mig -lgip` / `-lgipp`) and GPU instances "
                       "(`nvidia-smi mig -lgi`)", path, ln.no)
    frags: list[Fragment] = []
    section: str | None = None
    profiles: Fragment | None = None
    instances: Fragment | None = None
    placements: Fragment | None = None
    for ln in lines:
        t = ln.text
        if _LGIP_TITLE.search(t):
            section = "lgip"
            if profiles is None:
                profiles = Fragment(FORMAT_LGIP, path, hostname=host, enumerates_devices=False, first_line=ln.no)
                frags.append(profiles)
            continue
        if _LGI_TITLE.search(t):
            section = "lgi"
            if instances is None:
                instances = Fragment(FORMAT_LGI, path, hostname=host, enumerates_devices=False, first_line=ln.no)
                frags.append(instances)
            continue
        m = _PLACEMENT.match(t)
        if m:
            if placements is None:
                placements = Fragment(FORMAT_LGIPP, path, hostname=host, enumerates_devices=False,
                                      first_line=ln.no)
                frags.append(placements)
            gpu, pid = int(m.group(1)), int(m.group(2))
            starts = tuple(int(x) for x in m.group(3).replace(" ", "").split(",") if x)
            placements.placements[(gpu, pid)] = (starts, int(m.group(4)), m.group(5))
            placements.device(gpu, vendor="nvidia", mig_mode=True)
            continue
        if _PLACEMENT_LOOSE.match(t):
            raise fail(f"cannot read this placement line: {t.strip()!r} "
                       "(expected 'GPU <n> Profile ID <id> Placements: {<starts>}:<size>')", path, ln.no)
        row = _ROW.match(t)
        if row and section == "lgip":
            _profile_row(profiles, int(row.group(1)), row.group(2).split(), ln, path)
        elif row and section == "lgi":
            _instance_row(instances, int(row.group(1)), row.group(2).split(), ln, path)
    for f in frags:
        if not f.devices:
            raise fail(f"{f.format} table without any row", path, f.first_line)
    if not frags:
        raise fail("no MIG table found (expected `nvidia-smi mig -lgip`, `-lgipp` or `-lgi` output)", path)
    return frags


def _profile_row(frag: Fragment, gpu: int, tok: list[str], ln: Line, path: str) -> None:
    # tok: name id free/total memGiB p2p sm dec enc
    expected = "'| <gpu> MIG <name> <id> <free>/<total> <GiB> <P2P> <SM> <DEC> <ENC> |'"
    if len(tok) < 6:
        raise fail(f"cannot read this profile row ({len(tok) + 2} cells); expected {expected}", path, ln.no)
    name, pid, ft, mem = tok[0], tok[1], tok[2], tok[3]
    m = _FREE_TOTAL.match(ft)
    if not pid.isdigit() or not m:
        raise fail(f"cannot read this profile row: id {pid!r}, instances {ft!r}; expected {expected}", path, ln.no)
    try:
        memory_mib = round(float(mem) * 1024)
    except ValueError:
        raise fail(f"memory {mem!r} is not a number of GiB; expected {expected}", path, ln.no) from None
    sms = next((int(x) for x in tok[4:] if x.isdigit()), None)
    dev = frag.device(gpu, vendor="nvidia", mig_mode=True)
    rows = dev.setdefault("_mig_rows", [])
    if any(r[1] == int(pid) for r in rows):
        raise fail(f"profile id {pid} listed twice for GPU {gpu}", path, ln.no)
    rows.append((name, int(pid), int(m.group(2)), memory_mib, sms))


def _instance_row(frag: Fragment, gpu: int, tok: list[str], ln: Line, path: str) -> None:
    # tok: name profile-id instance-id start:size
    expected = "'| <gpu> MIG <name> <profile id> <instance id> <start>:<size> |'"
    if len(tok) != 4 or not tok[1].isdigit() or not tok[2].isdigit() or not re.match(r"^\d+:\d+$", tok[3]):
        raise fail(f"cannot read this GPU-instance row; expected {expected}", path, ln.no)
    start, size = (int(x) for x in tok[3].split(":"))
    dev = frag.device(gpu, vendor="nvidia", mig_mode=True)
    parts = list(dev.get("partitions", ()))
    if any(p.gi_id == int(tok[2]) for p in parts):
        raise fail(f"GPU instance {tok[2]} listed twice for GPU {gpu}", path, ln.no)
    parts.append(Partition(parent=gpu, profile=tok[0], gi_id=int(tok[2]), start=start, size=size))
    dev["partitions"] = tuple(parts)


def build_profiles(gpu: int, rows: list[tuple], placements: dict) -> tuple[tuple[MigProfile, ...], list[str]]:
    """MIG profiles of GPU ``gpu`` from ``-lgip`` rows and ``-lgipp`` placements.

    Args:
        rows: ``(name, id, max_instances, memory_mib, sms)`` per profile.
        placements: ``(gpu, profile id) -> (starts, slots, name)`` from ``-lgipp``.

    Returns:
        The profiles, and the names of those whose placements had to be inferred.
    """
    if not rows:
        return (), []
    biggest = max(rows, key=lambda r: r[3])
    g = _GEOM.match(biggest[0])
    total_slots = 8 if not g or int(g.group(1)) >= 7 else int(g.group(1))
    inferred = []
    profiles = []
    for name, pid, total, mem, sms in rows:
        exact = placements.get((gpu, pid))
        if exact:
            starts, slots = exact[0], exact[1]
        else:
            slots = max(1, min(total_slots, round(mem * total_slots / biggest[3]))) if biggest[3] else 1
            starts = tuple(k * slots for k in range(total) if k * slots + slots <= total_slots) or (0,)
            inferred.append(name)
        profiles.append(MigProfile(name=name, id=pid, max_instances=total, memory_mib=mem,
                                   placements=starts, slots=slots, sms=sms))
    return tuple(profiles), inferred


def placement_profiles(gpu: int, placements: dict, model: str | None) -> tuple[tuple[MigProfile, ...], str]:
    """MIG profiles of GPU ``gpu`` from ``-lgipp`` placements alone (no ``-lgip`` table), and a note on naming.

    A placement line that carries its profile name (``... :1  MIG 1g.10gb``) is named by
    it; else the catalog's MIG table of ``model`` names the profile id when the table
    has that id with the same slot size (ids are device- and driver-specific, so the
    size must agree); else the profile is ``#<id>``: its placements are exact, its
    memory and SMs unknown and its instance count the most non-overlapping placements
    (an upper bound: ``+me`` profiles allow one).
    """

    table: dict[int, MigProfile] = {}
    if model:
        try:
            table = {p.id: p for p in mig_table(model)}
        except CatalogError:
            table = {}
    out: list[MigProfile] = []
    named, unnamed = [], []
    for (g, pid), (starts, slots, name) in placements.items():
        if g != gpu:
            continue
        ref = table.get(pid)
        if ref is not None and ref.slots == slots and (name is None or name == ref.name):
            out.append(MigProfile(ref.name, pid, ref.max_instances, ref.memory_mib, tuple(starts), slots, ref.sms))
            named.append(f"{pid}={ref.name}")
        elif name is not None:
            out.append(MigProfile(name, pid, _most(starts, slots), None, tuple(starts), slots, None))
            named.append(f"{pid}={name}")
        else:
            out.append(MigProfile(f"#{pid}", pid, _most(starts, slots), None, tuple(starts), slots, None))
            unnamed.append(pid)
    if unnamed:
        note = (f"GPU {gpu}: `mig -lgipp` without `-lgip` names no profile for id(s) {', '.join(map(str, unnamed))}: "
                f"placements kept as {', '.join(f'#{p}' for p in unnamed)} (memory unknown, instance counts are "
                "bounds); import `nvidia-smi mig -lgip`, or `nvidia-smi -L` of a GPU model the catalog knows, "
                "to name them")
    else:
        src = f"the catalog's MIG table for {model!r}" if table else "the placement lines"
        note = f"GPU {gpu}: `mig -lgipp` without `-lgip`: profiles named from {src} by profile id ({', '.join(named)})"
    return tuple(out), note


def _most(starts, slots: int) -> int:
    """Most non-overlapping placements of ``slots`` slices among ``starts``."""
    end = -1
    n = 0
    for st in sorted(starts):
        if st > end:
            n += 1
            end = st + slots - 1
    return max(n, 1)
