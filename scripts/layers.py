#!/usr/bin/env python3
"""Checks that kgpu's code calls down its layers, never up (docs/architecture.md).

The facts come from the compiler, not from reading the C: for every object
file of a build, `nm` lists the symbols it defines and the ones it needs, and
the compiler's dependency file (.o.d) lists the headers it included. A call
from file A to a function that file B defines is an edge A -> B; so is a use
of B's global data.

src/layers.conf says, per component (a folder under src/), which other
components it may use and its layers, bottom first. The check fails on:
  - an edge from a file to a file of a higher layer of its component;
  - a circle of files inside a component (A calls B calls ... calls A), even
    inside one layer: each file must be readable knowing only what is below;
  - an edge or an include into a component it does not list under `uses`;
  - a file over the component's `max-lines`;
  - a source file the configuration does not place, or places twice.

  scripts/layers.py BUILD_DIR            check; exit 1 with one line a problem
  scripts/layers.py BUILD_DIR --edges    also print every edge, for reading
  --root DIR                             the source tree (default: this script's repository),
                                         whose src/layers.conf is read
"""
import os
import re
import subprocess
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_conf(path):
    comps = {}  # name -> {"uses": set, "layers": [(layer, [files])], "max_lines": int|None}
    cur = None
    with open(path, encoding="utf-8") as f:
        for lineno, raw in enumerate(f, 1):
            line = raw.split("#", 1)[0].rstrip()
            if not line.strip():
                continue
            words = line.split()
            where = f"{os.path.relpath(path, ROOT)}:{lineno}"
            if words[0] == "component":
                if len(words) != 2:
                    sys.exit(f"{where}: 'component NAME'")
                cur = {"uses": set(), "layers": [], "max_lines": None}
                comps[words[1]] = cur
            elif cur is None:
                sys.exit(f"{where}: '{words[0]}' before any 'component'")
            elif words[0] == "uses":
                cur["uses"].update(w for w in words[1:] if w != "-")
            elif words[0] == "max-lines":
                cur["max_lines"] = int(words[1])
            elif words[0] == "layer":
                if len(words) < 3:
                    sys.exit(f"{where}: 'layer NAME FILE...'")
                cur["layers"].append((words[1], words[2:]))
            else:
                sys.exit(f"{where}: unknown word '{words[0]}'")
    for name, c in comps.items():
        for u in c["uses"]:
            if u not in comps:
                sys.exit(f"{os.path.relpath(path, ROOT)}: {name} uses unknown component {u}")
    return comps


def libc_symbols():
    """What the C library defines: a file that defines dlsym or malloc (the
    interception library's interposers) is not what a caller of libc calls."""
    out = set()
    for lib in ("libc.so.6", "libdl.so.2", "libpthread.so.0", "libm.so.6"):
        for d in ("/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu", "/lib64", "/lib"):
            path = os.path.join(d, lib)
            if os.path.exists(path):
                res = subprocess.run(["nm", "-D", "--defined-only", path],
                                     capture_output=True, text=True)
                for line in res.stdout.splitlines():
                    parts = line.split()
                    if parts:
                        out.add(parts[-1].split("@")[0])
                break
    return out


def objects(build):
    """(source path relative to ROOT, object path) for every object built from src/."""
    out = []
    for dirpath, _, files in os.walk(os.path.join(build, "CMakeFiles")):
        for fn in files:
            if not fn.endswith(".c.o"):
                continue
            obj = os.path.join(dirpath, fn)
            m = re.search(r"\.dir/(src/.*)\.o$", obj.replace(os.sep, "/"))
            # An object whose source is gone (renamed, split) is stale: not read.
            if m and os.path.exists(os.path.join(ROOT, m.group(1))):
                out.append((m.group(1), obj))
    return out


def symbols(obj):
    """(defined, undefined) global symbol names of one object."""
    res = subprocess.run(["nm", "-P", "-g", obj], capture_output=True, text=True, check=True)
    defined, undefined = set(), set()
    for line in res.stdout.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        name, kind = parts[0], parts[1]
        (undefined if kind in ("U", "w", "v") else defined).add(name)
    return defined, undefined


def includes(obj):
    """Headers under src/ that the object's compilation read (the .o.d depfile)."""
    dep = obj + ".d"
    out = set()
    if not os.path.exists(dep):
        return out
    with open(dep, encoding="utf-8") as f:
        text = f.read().replace("\\\n", " ")
    for word in text.split():
        if word.endswith(":"):
            continue
        p = os.path.normpath(word if os.path.isabs(word) else os.path.join(ROOT, word))
        rel = os.path.relpath(p, ROOT).replace(os.sep, "/")
        if rel.startswith("src/") and rel.endswith(".h"):
            out.add(rel)
    return out


def component_of(rel):
    parts = rel.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "src" else None


def find_cycles(nodes, edges):
    """Strongly connected components of more than one file (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(argv) >= 2 else 2
    global ROOT
    build = argv[1]
    rest = argv[2:]
    show_edges = "--edges" in rest
    if "--root" in rest:
        ROOT = os.path.abspath(rest[rest.index("--root") + 1])
    comps = load_conf(os.path.join(ROOT, "src", "layers.conf"))
    problems = []

    # Which component and layer each source file is in, from the configuration.
    layer_of = {}
    for cname, c in comps.items():
        for rank, (lname, files) in enumerate(c["layers"]):
            for fn in files:
                rel = f"src/{cname}/{fn}"
                if rel in layer_of:
                    problems.append(f"{rel}: placed twice in src/layers.conf")
                layer_of[rel] = (rank, lname)
                if not os.path.exists(os.path.join(ROOT, rel)):
                    problems.append(f"{rel}: in src/layers.conf but not in the tree")
        if c["layers"]:
            folder = os.path.join(ROOT, "src", cname)
            for fn in sorted(os.listdir(folder)):
                rel = f"src/{cname}/{fn}"
                if fn.endswith(".c") and rel not in layer_of:
                    problems.append(f"{rel}: not placed in a layer of src/layers.conf")
        if c["max_lines"]:
            folder = os.path.join(ROOT, "src", cname)
            for fn in sorted(os.listdir(folder)):
                if fn.endswith((".c", ".h")):
                    with open(os.path.join(folder, fn), encoding="utf-8") as f:
                        n = sum(1 for _ in f)
                    if n > c["max_lines"]:
                        problems.append(f"src/{cname}/{fn}: {n} lines, over the component's "
                                        f"max-lines {c['max_lines']}")

    objs = objects(build)
    if not objs:
        print(f"layers: no object files under {build}/CMakeFiles: build first", file=sys.stderr)
        return 2
    defined_by = defaultdict(set)  # symbol -> source files
    needs = defaultdict(set)       # source file -> undefined symbols
    incs = defaultdict(set)        # source file -> headers under src/
    for rel, obj in objs:
        d, u = symbols(obj)
        for s in d:
            defined_by[s].add(rel)
        needs[rel] |= u
        incs[rel] |= includes(obj)

    for s in libc_symbols():
        defined_by.pop(s, None)
    edges = defaultdict(set)  # file -> files
    why = {}                  # (a, b) -> a symbol
    for a, syms in needs.items():
        for s in sorted(syms):
            for b in defined_by.get(s, ()):
                if b != a:
                    edges[a].add(b)
                    why.setdefault((a, b), s)

    for a in sorted(edges):
        ca = component_of(a)
        for b in sorted(edges[a]):
            cb = component_of(b)
            if show_edges:
                print(f"edge {a} -> {b} ({why[(a, b)]})")
            if ca not in comps:
                continue
            if cb != ca:
                if cb not in comps[ca]["uses"]:
                    problems.append(f"{a} -> {b} ({why[(a, b)]}): {ca} does not use {cb}")
                continue
            if a in layer_of and b in layer_of and layer_of[b][0] > layer_of[a][0]:
                problems.append(f"{a} -> {b} ({why[(a, b)]}): up from layer {layer_of[a][1]} "
                                f"to layer {layer_of[b][1]}")
    for a in sorted(incs):
        ca = component_of(a)
        if ca not in comps:
            continue
        for h in sorted(incs[a]):
            ch = component_of(h)
            if ch and ch != ca and ch not in comps[ca]["uses"]:
                problems.append(f"{a} includes {h}: {ca} does not use {ch}")

    for cname in sorted(comps):
        files = {f for f in needs if component_of(f) == cname}
        sub = {a: {b for b in edges.get(a, ()) if component_of(b) == cname} for a in files}
        for cyc in find_cycles(files, sub):
            members = set(cyc)
            links = [f"{a} -> {b} ({why[(a, b)]})" for a in cyc for b in sorted(sub[a])
                     if b in members]
            problems.append(f"circle in src/{cname}: " + "; ".join(links))

    for p in problems:
        print(f"layers: {p}")
    checked = sum(1 for f in needs if component_of(f) in comps)
    nedges = sum(len(v) for v in edges.values())
    print(f"layers: {checked} files, {nedges} edges, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
