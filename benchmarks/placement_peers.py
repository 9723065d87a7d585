"""The peers' own test suites on rayaccel: how many cases are identical, differ (better), or worse.

The cases are go-gpuallocator's table tests (besteffort_test.go, staticdgx_test.go,
simple_test.go on its DGX-1 Volta / Pascal and 4x RTX 8000 test nodes, plus the
8x A10 node of its open PR #24 and the required-device cases of its PR #18),
HAMi's topology-aware cases and the ROCm device plugin's best-effort cases on its
MI210 KFD capture, transcribed as data in tests/peers/*.json. A case is
*identical* when rayaccel picks the peer's set (or both refuse), *differs
(better)* when its set is no worse on the weakest link, the peer's own link
weights and the modeled all-reduce, and better on at least one (for one device:
on what is left for later jobs); *answers* when the peer refuses a request
rayaccel can serve (its static policy knows only sizes 1, 2, 4, 8). *Worse*
would be a regression (tests/placement/test_placement_peers.py fails on it).

Run: python benchmarks/placement_peers.py [--list]
"""

from __future__ import annotations

import argparse
import sys

from _placement_common import ROOT

sys.path.insert(0, str(ROOT / "tests" / "placement"))

import peer_suites as P  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="one line per case that is not identical")
    args = ap.parse_args(argv)
    counts = P.summary()
    cols = ("cases", "identical", "both refuse", "differs (better)", "answers (peer refuses)", "worse",
            "required cases", "required answered")
    print("peer test suites on rayaccel (tests/peers/*.json)")
    print(f"{'suite':26} " + " ".join(f"{c:>{max(len(c), 5)}}" for c in cols))
    total = dict.fromkeys(cols, 0)
    for source, c in counts.items():
        print(f"{source:26} " + " ".join(f"{c[k]:>{max(len(k), 5)}}" for k in cols))
        for k in cols:
            total[k] += c[k]
    print(f"{'ALL':26} " + " ".join(f"{total[k]:>{max(len(k), 5)}}" for k in cols))
    print("identical = the peer's set (or both refuse); differs (better) = no worse on weakest link, the peer's "
          "own weights and modeled all-reduce, better on one; required answered = a set holding them or a "
          "refusal naming why.")
    if args.list:
        for suite, case in P.cases():
            out = P.run(suite, case)
            v = P.verdict(suite, case, out)
            if v not in ("identical", "both refuse"):
                print(f"- {suite['source']} {case['file']} {case['test']}: peer {case['expected']}, "
                      f"rayaccel {list(out.devices) if out.devices else out.refused} -- {case.get('why', '')}")


if __name__ == "__main__":
    main()
