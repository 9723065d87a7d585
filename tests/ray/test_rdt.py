"""The ``rayaccel`` tensor transport in Ray Direct Transport, on two simulated DGX-A100 nodes (issue 15).

Unchanged Ray code but for ``tensor_transport="rayaccel"``: real transfers between actors
on CPU tensors -- shared memory on one node, NIXL across nodes -- and RDT's semantics:
garbage collection, ``wait_tensor_freed``, a producer killed before and during a
transfer, a consumer without NIXL, concurrent consumers, dtypes, shapes, strides and
containers. One cluster for the module.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time

import pytest
from raytest_helpers import wait_for

from rayaccel import _proc

torch = pytest.importorskip("torch")
pytest.importorskip("nixl")

pytestmark = pytest.mark.ray

from rayaccel.ray import _ray_private as _rp  # noqa: E402

if _rp.release_tuple() < _rp.TRANSPORT.since:  # the older path (object store, one warning): test_private_api.py
    pytest.skip(f"Ray {_rp.release()} does not carry {_rp.TRANSPORT.name} (Ray >= {_rp.TRANSPORT.since_text})",
                allow_module_level=True)

MiB = 1 << 20
DTYPES = ("float32", "float16", "bfloat16", "int8", "uint8", "int32", "int64", "bool", "complex64", "float64")


def digest(t) -> str:
    """Of a tensor's values in row-major order (any dtype, any strides)."""
    t = t.detach().contiguous().reshape(-1)
    return hashlib.sha256(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"").hexdigest() + str(
        (tuple(t.shape), str(t.dtype)))


def make(nbytes: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-2**31, 2**31 - 1, (nbytes // 4,), dtype=torch.int32, generator=g).view(torch.float32)


def mixed(seed: int) -> list:
    """Tensors of every dtype in DTYPES and several shapes (0-d, empty, 3-d), deterministic."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, name in enumerate(DTYPES):
        dt = getattr(torch, name)
        shape = [(), (0,), (3,), (4, 5), (2, 3, 7), (1, 1, 1, 9)][i % 6]
        raw = torch.randint(0, 255, (max(1, int(torch.tensor(shape).prod().item()) if shape else 1) * 16,),
                            dtype=torch.uint8, generator=g)
        n = int(torch.tensor(shape, dtype=torch.int64).prod().item()) if shape else 1
        item = torch.empty((), dtype=dt).element_size()
        t = raw[: n * item].view(dt).reshape(shape) if n else torch.empty(shape, dtype=dt)
        if dt.is_floating_point or dt.is_complex:
            t = torch.nan_to_num(t) if not dt.is_complex else t
        out.append(t)
    return out


def strided(seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    base = torch.rand(64, 48, generator=g)
    return [base.t(), base[::3, 5:40:2], base[:, 7], base.unsqueeze(0).expand(3, 64, 48)[1:, ::4]]


@pytest.fixture(scope="module")
def two_a100(ray_env):
    import ray

    import rayaccel.ray  # noqa: F401 - the driver side of the transport (``import rayaccel`` once merged)
    from rayaccel.ray.driver.cluster import SimulatedCluster

    if ray.is_initialized():
        ray.shutdown()
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    c = SimulatedCluster(["dgx-a100", "dgx-a100"], num_cpus=2, object_store_memory=400 << 20,
                         logging_level="ERROR", log_to_driver=False, metrics_export_port=port,
                         env={"RAY_rdt_fetch_fail_timeout_milliseconds": "60000"})
    c.metrics_port = port
    try:
        yield c
    finally:
        c.shutdown()


def _actors(cluster):
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(enable_tensor_transport=True, num_gpus=1, num_cpus=0)
    class Producer:
        def __init__(self, no_shm: bool = False, full_shm: bool = False):
            self.held = {}
            if no_shm:  # a node without /dev/shm (e.g. a container that has none)
                from pathlib import Path

                from rayaccel.ray.rdt import shm

                shm.SHM_DIR = Path("/nonexistent-shm")
            if full_shm:  # a /dev/shm with no room left (e.g. Docker's 64 MiB default)
                import errno

                def full(*args):
                    raise OSError(errno.ENOSPC, "No space left on device")

                os.pwrite = full

        def make(self, key: str, nbytes: int, seed: int) -> str:
            self.held[key] = make(nbytes, seed)
            return digest(self.held[key])

        @ray.method(tensor_transport="rayaccel")
        def get(self, key: str):
            return self.held[key]

        @ray.method(tensor_transport="rayaccel")
        def many(self, seed: int):
            return mixed(seed)

        @ray.method(tensor_transport="rayaccel")
        def strided(self, seed: int):
            return strided(seed)

        @ray.method(tensor_transport="rayaccel")
        def nested(self, seed: int):
            ts = mixed(seed)
            return {"weights": ts[:3], "bias": ts[3], "step": 7, "name": "layer0", "more": {"x": (ts[4], ts[5])}}

        def leaks(self) -> dict:
            from ray._private.worker import global_worker

            from rayaccel.memory.owners import SHM_DIR
            from rayaccel.ray import rdt
            mine = [p.name for p in SHM_DIR.iterdir() if p.name.startswith(f"rayaccel_{os.getpid()}-")]
            store = global_worker.rdt_manager.rdt_store.get_num_objects()
            # segments of freed objects the pool keeps for later ones are not leaks (bounded: test_rdt_unit.py)
            return {"transport": rdt.produced(), "rdt_store": store, "segments": len(mine) - rdt.pooled()}

        def wait_freed(self, key: str, timeout: float) -> str:
            from ray.experimental import wait_tensor_freed

            try:
                wait_tensor_freed(self.held[key], timeout=timeout)
            except TimeoutError:
                return "held"
            return "freed"

        def pid(self) -> int:
            return os.getpid()

        def step(self, key: str, by: int) -> str:
            """A trainer's step: in place, once Ray freed the last object holding the tensor."""
            from ray.experimental import wait_tensor_freed

            wait_tensor_freed(self.held[key], timeout=60)
            self.held[key].view(torch.int32).add_(by)
            return digest(self.held[key])

        def transport_state(self) -> dict:
            from rayaccel.ray import _ray_private as rp
            from rayaccel.ray.rdt.transport import manager

            m = manager()
            nixl = rp.nixl_manager()
            return {**{k: v for k, v in vars(m.pool.stats()).items() if k != "free"},
                    "held": len(m.registrations), "nixl_version": nixl._nixl_agent_meta_version}

    @ray.remote(enable_tensor_transport=True, num_gpus=1, num_cpus=0)
    class Consumer:
        def __init__(self, hide_nixl: bool = False):
            import logging

            self.records = []
            handler = logging.Handler()
            handler.emit = lambda r: self.records.append(r.getMessage())
            logging.getLogger("rayaccel.ray.rdt").addHandler(handler)
            if hide_nixl:  # this process cannot import NIXL, as on a node where it is not installed
                import sys

                from rayaccel.ray.rdt import local

                sys.modules["nixl"] = None
                sys.modules["nixl._api"] = None
                local.nixl.cache_clear()

        def check(self, t) -> str:
            return digest(t)

        def check_all(self, ts) -> list:
            return [digest(t) for t in ts]

        def check_nested(self, d) -> dict:
            return {"weights": [digest(t) for t in d["weights"]], "bias": digest(d["bias"]), "step": d["step"],
                    "name": d["name"], "more": [digest(t) for t in d["more"]["x"]],
                    "x_type": type(d["more"]["x"]).__name__}

        def keep(self, t) -> str:
            self.kept = t  # a rollout keeps its weights until the next sync
            return digest(t)

        def kept_digest(self) -> str:
            return digest(self.kept)

        def write_into(self, t) -> str:
            t.view(-1)[0] = 12345.0  # RDT objects are the consumer's to change: its own pages only
            return digest(t)

        def stats(self) -> dict:
            from rayaccel.ray import rdt
            return rdt.stats()

        def warnings(self) -> list:
            return [r for r in self.records if "object store" in r]

        def node(self) -> str:
            return ray.get_runtime_context().get_node_id()

    n0, n1 = cluster.node_ids
    pin = lambda n: NodeAffinitySchedulingStrategy(n, soft=False)  # noqa: E731
    return Producer, Consumer, pin, n0, n1


@pytest.fixture(scope="module")
def actors(two_a100):
    import ray

    Producer, Consumer, pin, n0, n1 = _actors(two_a100)
    a = {
        "Producer": Producer, "Consumer": Consumer, "pin": pin, "n0": n0, "n1": n1,
        "producer": Producer.options(scheduling_strategy=pin(n0)).remote(),
        "near": Consumer.options(scheduling_strategy=pin(n0)).remote(),
        "far": Consumer.options(scheduling_strategy=pin(n1)).remote(),
        "far2": Consumer.options(scheduling_strategy=pin(n1)).remote(),
    }
    assert ray.get([a[k].node.remote() for k in ("near", "far", "far2")]) == [n0, n1, n1]
    return a


def _no_leaks(producer):
    import ray

    wait_for(lambda: ray.get(producer.leaks.remote()) == {"transport": 0, "rdt_store": 0, "segments": 0}, 60,
             "the producer to hold no object, no RDT entry and no segment")


def test_64mib_reaches_a_consumer_on_its_node_and_one_on_the_other_bit_identical_repeatedly(actors):
    """Issue 15's first done-when."""
    import ray

    p, near, far = actors["producer"], actors["near"], actors["far"]
    want = ray.get(p.make.remote("w", 64 * MiB, 1))
    for _ in range(3):
        ref = p.get.remote("w")
        assert ray.get([near.check.remote(ref), far.check.remote(ref)], timeout=300) == [want, want]
        assert digest(ray.get(ref, timeout=300)) == want  # the driver (owner, on node 0) too
        del ref
    near_s, far_s = ray.get(near.stats.remote()), ray.get(far.stats.remote())
    assert near_s["shared-memory"]["objects"] >= 3 and "nixl" not in near_s
    assert far_s["nixl"]["objects"] >= 3 and set(far_s) == {"nixl"}
    assert near_s["shared-memory"]["bytes"] >= 3 * 64 * MiB and far_s["nixl"]["seconds"] > 0
    assert "NIXL over UCX" in far_s["nixl"]["last_reason"]
    _no_leaks(p)


def test_weight_sync_rounds_refill_one_segment_and_keep_one_nixl_registration(actors):
    """A trainer's weights changed in place between rounds (after wait_tensor_freed) reach a rollout on its
    node and one on the other bit-identical every round; what each rollout kept from the last round does
    not change when the trainer writes; the segment is refilled, not made anew, and NIXL registers the
    weights once (no deregistration: the agent's metadata version stays)."""
    import ray

    p, near, far = actors["producer"], actors["near"], actors["far"]
    ray.get(p.make.remote("sync", 24 * MiB, 21))
    versions, last = [], None
    for r in range(5):
        want = ray.get(p.step.remote("sync", r + 1))
        if last is not None:
            assert ray.get([near.kept_digest.remote(), far.kept_digest.remote()]) == [last, last]
        ref = p.get.remote("sync")
        assert ray.get([near.keep.remote(ref), far.keep.remote(ref)], timeout=300) == [want, want]
        del ref
        versions.append(ray.get(p.transport_state.remote())["nixl_version"])
        last = want
    st = ray.get(p.transport_state.remote())
    assert st["refilled"] >= 2 and st["held"] >= 1, st
    assert len(set(versions[1:])) == 1, versions  # no deregistration between rounds
    _no_leaks(p)


def test_bytes_and_seconds_per_path_reach_rays_prometheus_endpoint(two_a100, actors):
    """Counted by the receiving process (the near consumer, on the head node) through ray.util.metrics."""
    import urllib.request

    import ray

    from rayaccel import metrics_names as M

    p, near = actors["producer"], actors["near"]
    ray.get(p.make.remote("metrics", MiB, 14))
    ref = p.get.remote("metrics")
    ray.get(near.check.remote(ref))
    del ref
    url = f"http://127.0.0.1:{two_a100.metrics_port}/metrics"

    def scraped():
        try:
            text = urllib.request.urlopen(url, timeout=5).read().decode()
        except OSError:
            return None
        lines = [ln for ln in text.splitlines() if ln.startswith(M.exported(M.TRANSPORT_BYTES_TOTAL))
                 and 'path="shared-memory"' in ln]
        return lines or None

    lines = wait_for(scraped, 90, "the transport's bytes on the head's metrics endpoint")
    assert float(lines[0].rsplit(" ", 1)[1]) >= MiB and f'node="{actors["n0"]}"' in lines[0]
    _no_leaks(p)


def test_every_worker_of_a_rayaccel_node_knows_the_transport(actors):
    """Without any registration pushed by a driver (a plain actor, no enable_tensor_transport)."""
    import ray

    @ray.remote(num_cpus=0)
    def worker_side():
        import sys

        from ray.experimental.rdt import util

        wrapped = getattr(util._ensure_default_transports_registered, "__rayaccel_wrapped__", False)
        return wrapped, "rayaccel.ray.worker.hook" in sys.modules, util.normalize_and_validate_tensor_transport("rayaccel")

    for n in (actors["n0"], actors["n1"]):
        assert ray.get(worker_side.options(scheduling_strategy=actors["pin"](n)).remote()) == (True, True, "RAYACCEL")


def test_garbage_collection_and_wait_tensor_freed(actors):
    import ray

    p, near = actors["producer"], actors["near"]
    ray.get(p.make.remote("g", 4 * MiB, 2))
    ref = p.get.remote("g")
    ray.get(near.check.remote(ref))
    assert ray.get(p.leaks.remote())["transport"] == 1
    assert ray.get(p.wait_freed.remote("g", 1.0)) == "held"  # the driver still holds the ref
    del ref
    assert ray.get(p.wait_freed.remote("g", 60.0)) == "freed"
    _no_leaks(p)


def test_consumers_writes_stay_their_own(actors):
    import ray

    p, near, far = actors["producer"], actors["near"], actors["far"]
    want = ray.get(p.make.remote("m", MiB, 3))
    ref = p.get.remote("m")
    assert ray.get(near.write_into.remote(ref)) != want
    assert ray.get([near.check.remote(ref), far.check.remote(ref)]) == [want, want]
    del ref
    _no_leaks(p)


def test_concurrent_consumers_of_one_tensor(actors):
    import ray

    p = actors["producer"]
    want = ray.get(p.make.remote("c", 24 * MiB, 4))  # above EAGER_BYTES: the first requests make the segment
    ref = p.get.remote("c")
    cons = [actors["near"], actors["far"], actors["far2"]]
    pending = [c.check.remote(ref) for c in cons for _ in range(2)]  # three actors at once, twice each
    out = []
    t = threading.Thread(target=lambda r=ref: out.append(digest(ray.get(r, timeout=300))))  # and the driver
    t.start()
    got = ray.get(pending, timeout=300)
    t.join(300)
    assert got == [want] * 6 and out == [want]
    del ref
    _no_leaks(p)


@pytest.mark.parametrize("where", ["near", "far"])
def test_several_dtypes_and_shapes(actors, where):
    import ray

    p, c = actors["producer"], actors[where]
    want = [digest(t) for t in mixed(5)]
    ref = p.many.remote(5)
    assert ray.get(c.check_all.remote(ref), timeout=300) == want
    assert [digest(t) for t in ray.get(ref)] == want
    del ref
    _no_leaks(p)


@pytest.mark.parametrize("where", ["near", "far"])
def test_non_contiguous_tensors(actors, where):
    import ray

    p, c = actors["producer"], actors[where]
    want = [digest(t) for t in strided(6)]
    ref = p.strided.remote(6)
    assert ray.get(c.check_all.remote(ref), timeout=300) == want
    del ref
    _no_leaks(p)


@pytest.mark.parametrize("where", ["near", "far"])
def test_a_dict_of_lists_of_tensors_in_one_return(actors, where):
    import ray

    p, c = actors["producer"], actors[where]
    ts = mixed(7)
    ref = p.nested.remote(7)
    got = ray.get(c.check_nested.remote(ref), timeout=300)
    assert got == {"weights": [digest(t) for t in ts[:3]], "bias": digest(ts[3]), "step": 7, "name": "layer0",
                   "more": [digest(ts[4]), digest(ts[5])], "x_type": "tuple"}
    del ref
    _no_leaks(p)


def test_a_consumer_without_nixl_on_the_other_node_gets_one_clear_error(actors):
    import ray

    p = actors["producer"]
    bare = actors["Consumer"].options(scheduling_strategy=actors["pin"](actors["n1"])).remote(hide_nixl=True)
    want = ray.get(p.make.remote("n", MiB, 8))
    ref = p.get.remote("n")
    with pytest.raises(ray.exceptions.RayTaskError) as e:
        ray.get(bare.check.remote(ref), timeout=300)
    msg = str(e.value)
    assert "pip install 'rayaccel[nixl]'" in msg and "TransportUnavailable" in msg and "NIXL" in msg
    assert ray.get(actors["near"].check.remote(ref)) == want  # the object itself is fine
    ray.kill(bare)
    del ref
    _no_leaks(p)


@pytest.mark.parametrize("where", ["near", "far", "driver"])
def test_a_producer_killed_before_the_transfer_is_one_clear_error(actors, where):
    import ray

    Producer, pin = actors["Producer"], actors["pin"]
    doomed = Producer.options(scheduling_strategy=pin(actors["n0"])).remote()
    ray.get(doomed.make.remote("k", 4 * MiB, 9))
    pid = ray.get(doomed.pid.remote())
    ref = doomed.get.remote("k")
    ray.wait([ref], fetch_local=False)
    ray.kill(doomed)
    wait_for(lambda: _dead(doomed), 60, "Ray to see the producer dead")
    wait_for(lambda: _proc.state(pid) in (None, "Z"), 60, "the producer's process to end")
    t0 = time.monotonic()
    with pytest.raises(Exception) as e:
        if where == "driver":
            ray.get(ref, timeout=120)
        else:
            ray.get(actors[where].check.remote(ref), timeout=120)
    assert not isinstance(e.value, ray.exceptions.GetTimeoutError), "it hung"
    assert "TransportError" in repr(e.value) or "TransportError" in str(e.value), e.value
    assert "producer" in str(e.value) and "died" in str(e.value) or "could not serve" in str(e.value)
    assert time.monotonic() - t0 < 120


def test_a_producer_killed_during_a_cross_node_transfer_is_an_error_not_a_hang(actors):
    """Killed while the consumer asks for the tensor (NIXL registration) or reads it: one error, or the
    right bytes when the read won the race; never a hang, and the consumer keeps working."""
    import ray

    Producer, pin = actors["Producer"], actors["pin"]
    outcomes = []
    for delay in (0.1, 0.8):
        doomed = Producer.options(scheduling_strategy=pin(actors["n0"])).remote()
        ray.get(doomed.make.remote("k", 192 * MiB, 10))
        pid = ray.get(doomed.pid.remote())
        ref = doomed.get.remote("k")
        ray.wait([ref], fetch_local=False)  # the object exists: what follows is the transfer alone
        res = actors["far2"].check.remote(ref)
        time.sleep(delay)
        os.kill(pid, 9)
        try:
            got = ray.get(res, timeout=150)
        except ray.exceptions.GetTimeoutError:
            pytest.fail("the consumer hung on a dead producer")
        except ray.exceptions.RayTaskError as e:
            text = str(e)
            assert "TransportError" in text and "producer" in text and ("died" in text or "could not serve" in text
                                                                          or "NIXL read" in text), text
            outcomes.append(text.splitlines()[-1][:160])
        else:
            assert got == digest(make(192 * MiB, 10))
            outcomes.append("read before the kill")
        del ref, res
    print(outcomes)
    p = actors["producer"]
    want = ray.get(p.make.remote("after", MiB, 11))
    r2 = p.get.remote("after")
    assert ray.get(actors["far2"].check.remote(r2), timeout=300) == want
    del r2


@pytest.mark.parametrize("how,nbytes,why", [
    ("no_shm", 2 * MiB, "/nonexistent-shm does not exist"),  # known at once: the producer makes small segments eagerly
    ("full_shm", 24 * MiB, "No space left on device"),         # found when the first consumer asks for the segment
])
def test_without_shared_memory_it_goes_through_the_object_store_with_one_warning(actors, how, nbytes, why):
    import ray

    from rayaccel.ray.rdt.transport import EAGER_BYTES

    assert (nbytes <= EAGER_BYTES) == (how == "no_shm")

    Producer, Consumer, pin = actors["Producer"], actors["Consumer"], actors["pin"]
    p = Producer.options(scheduling_strategy=pin(actors["n0"])).remote(**{how: True})
    near = Consumer.options(scheduling_strategy=pin(actors["n0"])).remote()
    want = ray.get(p.make.remote("s", nbytes, 12))
    for _ in range(3):
        ref = p.get.remote("s")
        assert ray.get(near.check.remote(ref), timeout=300) == want
        del ref
    s = ray.get(near.stats.remote())
    assert set(s) == {"object-store"} and s["object-store"]["objects"] == 3 and why in s["object-store"]["last_reason"]
    warns = ray.get(near.warnings.remote())
    assert len(warns) == 1 and why in warns[0]
    _no_leaks(p)
    ray.kill(p)
    ray.kill(near)


def test_a_drivers_put_reaches_both_nodes(actors):
    import ray

    t = make(2 * MiB, 13)
    ref = ray.put(t, _tensor_transport="rayaccel")
    assert ray.get([actors["near"].check.remote(ref), actors["far"].check.remote(ref)], timeout=300) == [digest(t)] * 2
    del ref


def _dead(actor) -> bool:
    import ray

    try:
        ray.get(actor.pid.remote(), timeout=5)
    except ray.exceptions.RayActorError:
        return True
    except ray.exceptions.GetTimeoutError:
        return False
    return False
