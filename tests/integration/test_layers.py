#!/usr/bin/env python3
"""scripts/layers.py, the check that kgpu's code calls down its layers.

First against small trees built here, each with one thing wrong (a call up,
a circle inside one layer, an include of a component not used, a call into
it, a file too long, a file no layer places), which the check must name and
fail on, and the same tree put right, which it must pass; then against this
build's own objects, which must pass.

  test_layers.py --source SRC_DIR --build BUILD_DIR [--cc CC]
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

FAILS = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        FAILS.append(what)


def make_tree(root, conf, files, cc):
    """Writes src/... files and src/layers.conf, compiles each .c as CMake would lay it out."""
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    with open(os.path.join(root, "src", "layers.conf"), "w", encoding="utf-8") as f:
        f.write(conf)
    build = os.path.join(root, "build")
    for rel in files:
        if not rel.endswith(".c"):
            continue
        obj = os.path.join(build, "CMakeFiles", "t.dir", rel + ".o")
        os.makedirs(os.path.dirname(obj), exist_ok=True)
        inc = [f"-I{os.path.join(root, 'src', c)}" for c in ("low", "high", "other")]
        # Relative paths, as CMake's depfiles name the sources of this tree.
        subprocess.run([cc, "-c", "-MD", "-MF", obj + ".d", *inc, "-o", obj, rel], cwd=root,
                       check=True)
    return build


def run(script, build, root):
    res = subprocess.run([sys.executable, script, build, "--root", root], capture_output=True,
                         text=True)
    return res.returncode, res.stdout + res.stderr


def case(script, cc, name, conf, files, want_rc, want_text):
    root = tempfile.mkdtemp(prefix="kgpu-layers-")
    try:
        build = make_tree(root, conf, files, cc)
        rc, out = run(script, build, root)
        check(rc == want_rc and all(t in out for t in want_text),
              f"{name}: exit {rc} (want {want_rc}), names {want_text}\n{out.strip()}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--cc", default="cc")
    a = ap.parse_args()
    script = os.path.join(a.source, "scripts", "layers.py")

    base = "component low\n  uses -\n  layer bottom a.c\n  layer top b.c\n"
    a_c = '#include "a.h"\nint a_value(void) { return 1; }\n'
    a_h = "int a_value(void);\n"
    b_c = '#include "a.h"\nint b_value(void);\nint b_value(void) { return a_value() + 1; }\n'
    good = {"src/low/a.c": a_c, "src/low/a.h": a_h, "src/low/b.c": b_c}

    case(script, a.cc, "calls down", base, good, 0, ["0 problems"])
    up = dict(good)
    up["src/low/a.c"] = ('#include "a.h"\nint b_value(void);\n'
                         "int a_value(void) { return b_value(); }\n")
    case(script, a.cc, "a call up", base, up, 1,
         ["src/low/a.c -> src/low/b.c (b_value): up from layer bottom to layer top"])
    circle = dict(up)
    case(script, a.cc, "a circle inside one layer",
         "component low\n  uses -\n  layer one a.c b.c\n", circle, 1,
         ["circle in src/low", "src/low/a.c -> src/low/b.c (b_value)",
          "src/low/b.c -> src/low/a.c (a_value)"])
    across = dict(good)
    across["src/high/h.c"] = ('#include "a.h"\nint h_value(void);\n'
                              "int h_value(void) { return a_value(); }\n")
    case(script, a.cc, "a component it may not use",
         base + "component high\n  uses -\n  layer all h.c\n", across, 1,
         ["src/high/h.c -> src/low/a.c (a_value): high does not use low",
          "src/high/h.c includes src/low/a.h: high does not use low"])
    case(script, a.cc, "the same, used",
         base + "component high\n  uses low\n  layer all h.c\n", across, 0, ["0 problems"])
    case(script, a.cc, "a file too long", base.replace("  uses -\n", "  uses -\n  max-lines 2\n"),
         good, 1, ["src/low/b.c: 3 lines, over the component's max-lines 2"])
    unplaced = dict(good)
    unplaced["src/low/c.c"] = "int c_value(void);\nint c_value(void) { return 3; }\n"
    case(script, a.cc, "a file in no layer", base, unplaced, 1,
         ["src/low/c.c: not placed in a layer"])

    # kgpu itself, as this build compiled it.
    res = subprocess.run([sys.executable, script, a.build], capture_output=True, text=True)
    out = res.stdout + res.stderr
    check(res.returncode == 0 and " 0 problems" in out, "kgpu's own layers\n" + out.strip())

    print(f"{7 + 1 - len(FAILS)} passed, {len(FAILS)} failed")
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
