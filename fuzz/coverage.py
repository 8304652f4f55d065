"""Summarises `llvm-cov export -format=text` (on stdin) for fuzz/coverage.sh: per source file
the corpus enters, the lines run; per function it enters, the code regions run."""

import json
import re
import os
import subprocess
import sys

root = sys.argv[1]
data = json.load(sys.stdin)["data"][0]

print("files entered (lines run / lines):")
for f in sorted(data["files"], key=lambda f: f["filename"]):
    lines = f["summary"]["lines"]
    if lines["covered"]:
        name = os.path.relpath(f["filename"], root)
        print(f"  {name}: {lines['covered']}/{lines['count']} ({lines['percent']:.0f}%)")

ours = tuple(os.path.join(root, d) + os.sep for d in ("init/src", "parse/src"))
entered = [
    fn
    for fn in data["functions"]
    if fn["count"] > 0 and fn["filenames"][0].startswith(ours) and not fn["filenames"][0].endswith("/fuzzing.rs")
]
demangled = subprocess.run(
    ["c++filt"], input="\n".join(fn["name"] for fn in entered), capture_output=True, text=True, check=True
).stdout.split("\n")
rows, run, total = set(), 0, 0
for fn, name in zip(entered, demangled):
    # The function's own code regions (kind 0, in its first file), run or not.
    regions = [r for r in fn["regions"] if r[7] == 0 and r[5] == 0]
    done = sum(1 for r in regions if r[4] > 0)
    run, total = run + done, total + len(regions)
    # Without the crates' disambiguators (`core[667c…]`).
    name = re.sub(r"\[[0-9a-f]+\]", "", name)
    rows.add(f"  {name}: {done}/{len(regions)}")
print(f"functions entered: {len(entered)}; their code regions run: {run}/{total} ({100 * run / max(total, 1):.0f}%)")
print("\n".join(sorted(rows)))
