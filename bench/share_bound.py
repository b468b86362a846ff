#!/usr/bin/env python3
"""How many GPUs could the GPU shares a run placed have fitted into, at best?

Reads the JSON of `kgpu simulate --json` (share_packing.sizes_by_seed: the
shares each run placed, by milli) and, per policy and seed, solves the
bin-packing relaxation of Gilmore and Gomory by column generation: a GPU is a
bin of 1000 milli, a pattern is a set of shares that fits one GPU, and the
linear programme asks for the fewest patterns covering every share. Its
optimum rounded up is a lower bound on the GPUs that any placement of those
same shares needs (nodes, CPU and GPU models are ignored, which can only
lower it). Rounding the programme's solution down and packing what is left
by best-fit decreasing gives a real packing, an upper bound on the optimum.

Needs SciPy (Debian: python3-scipy). Usage:
    kgpu simulate ... --json > run.json
    bench/share_bound.py run.json
"""
import json
import math
import sys

try:
    import numpy as np
    from scipy.optimize import linprog
except ImportError as e:
    sys.exit("share_bound.py needs SciPy (Debian: apt-get install python3-scipy): %s" % e)

CAP = 1000


def best_pattern(sizes, counts, duals):
    """Bounded knapsack over capacity CAP: the pattern of most dual value."""
    best = [0.0] * (CAP + 1)
    take = [[0] * len(sizes) for _ in range(CAP + 1)]
    for i, (s, n) in enumerate(zip(sizes, counts)):
        for _ in range(min(n, CAP // s)):  # one copy at a time: 0/1 items
            for c in range(CAP, s - 1, -1):
                v = best[c - s] + duals[i]
                if v > best[c] + 1e-12:
                    best[c] = v
                    take[c] = take[c - s].copy()
                    take[c][i] += 1
    c = max(range(CAP + 1), key=lambda k: best[k])
    return best[c], take[c]


def lp_bound(hist):
    sizes = sorted(hist, reverse=True)
    counts = [hist[s] for s in sizes]
    m = len(sizes)
    patterns = []
    for i, s in enumerate(sizes):
        p = [0] * m
        p[i] = min(counts[i], CAP // s)
        patterns.append(p)
    while True:
        a = np.array(patterns, dtype=float).T  # m x npatterns
        res = linprog(np.ones(a.shape[1]), A_ub=-a, b_ub=-np.array(counts, dtype=float),
                      bounds=(0, None), method="highs")
        if res.status != 0:
            raise RuntimeError(res.message)
        duals = -res.ineqlin.marginals
        value, p = best_pattern(sizes, counts, duals)
        if value <= 1 + 1e-9:
            break
        patterns.append(p)
    lp = res.fun
    # A real packing: whole patterns from the solution, the rest best-fit decreasing.
    left = list(counts)
    bins = 0
    for x, p in zip(res.x, patterns):
        k = int(math.floor(x + 1e-9))
        while k > 0 and not all(left[i] >= p[i] * k for i in range(m)):
            k -= 1
        for i in range(m):
            left[i] -= p[i] * k
        bins += k
    free = []
    for i in range(m):
        for _ in range(left[i]):
            s = sizes[i]
            fit = [j for j, f in enumerate(free) if f >= s]
            if fit:
                j = min(fit, key=lambda j: free[j])
                free[j] -= s
            else:
                free.append(CAP - s)
    return lp, math.ceil(lp - 1e-6), bins + len(free)


def load(path):
    """The simulator's JSON, checked for what this script reads; exits naming what is wrong."""
    where = path or "standard input"
    try:
        doc = json.load(open(path) if path else sys.stdin)
    except (OSError, ValueError) as e:
        sys.exit("%s: %s" % (where, e))
    need = ("seeds", "alloc_pct_130_by_seed", "share_packing")
    for i, r in enumerate(doc.get("results", []) if isinstance(doc, dict) else []):
        sp = r.get("share_packing", {}) if isinstance(r, dict) else {}
        missing = [k for k in need if k not in r] + \
            [k for k in ("gpus_by_seed", "sizes_by_seed") if k not in sp]
        if missing:
            sys.exit("%s: results[%d] has no %s: is it `kgpu simulate --json` output (not "
                     "--churn) from a kgpu with share_packing?" % (where, i, ", ".join(missing)))
    if not isinstance(doc, dict) or "gpus" not in doc or not doc.get("results"):
        sys.exit("%s: not `kgpu simulate --json` output (no gpus or results)" % where)
    return doc


def main():
    doc = load(sys.argv[1] if len(sys.argv) > 1 else None)
    gpus = doc["gpus"]
    print("per policy and seed: the shares placed, their compute, the GPUs they took, the")
    print("fewest GPUs any packing of them needs (LP bound, and the best packing found),")
    print("idle GPU inside share GPUs as placed and at best, and allocation % as placed")
    print("and if the same shares had been packed best (everything else unchanged)\n")
    print(f"{'policy':<10} {'seed':>4} {'shares':>6} {'compute':>8} {'used':>5} {'LP bound':>8} "
          f"{'found':>5} {'idle':>6} {'idle min':>8} {'alloc %':>7} {'at best':>7}")
    for r in doc["results"]:
        sp = r["share_packing"]
        rows = []
        for seed, used, h, alloc in zip(r["seeds"], sp["gpus_by_seed"], sp["sizes_by_seed"],
                                        r["alloc_pct_130_by_seed"]):
            hist = {int(k): v for k, v in h.items()}
            compute = sum(k * v for k, v in hist.items()) / CAP
            _, lb, found = lp_bound(hist)
            best = alloc + (used - found) * 100.0 / gpus
            rows.append((compute, used, lb, found, used - compute, found - compute, alloc, best))
            print(f"{r['policy']:<10} {seed:>4} {sum(hist.values()):>6} {compute:>8.1f} {used:>5} "
                  f"{lb:>8} {found:>5} {used - compute:>6.1f} {found - compute:>8.1f} "
                  f"{alloc:>7.2f} {best:>7.2f}")
        mean = [sum(x[i] for x in rows) / len(rows) for i in range(8)]
        print(f"{r['policy']:<10} {'mean':>4} {'':>6} {mean[0]:>8.1f} {mean[1]:>5.0f} {mean[2]:>8.1f} "
              f"{mean[3]:>5.1f} {mean[4]:>6.1f} {mean[5]:>8.1f} {mean[6]:>7.2f} {mean[7]:>7.2f}")


if __name__ == "__main__":
    main()
