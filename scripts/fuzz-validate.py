#!/usr/bin/env python3
"""Mutation fuzzing of `archon validate`: random edits of the fixtures and example workflows must end in
diagnostics (exit 0 or 2), never a panic or a crash. Failing inputs are written to /tmp/archon-crash-N.*

usage: cargo build --release && scripts/fuzz-validate.py [RUNS] [SEED]
"""
import glob
import os
import random
import subprocess
import sys
import tempfile

runs = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
rng = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
binary = os.path.join(root, "target", "release", "archon")
files = sorted(
    glob.glob(os.path.join(root, "tests/fixtures/validate/*.yaml"))
    + glob.glob(os.path.join(root, "tests/fixtures/validate/*.toml"))
    + glob.glob(os.path.join(root, "workflows/*"))
)
pieces = list("{}[]:\"'-#&*!|>\n {}%.,=\\\t") + [
    "{{", "}}", "{%", "%}", "steps.", "inputs.", "item", "é", "日本", "\u2028", "\r\n", "*a", "&a ", "<<: ",
]
work = tempfile.mkdtemp()
crashes = 0
for _ in range(runs):
    text = list(open(rng.choice(files), encoding="utf-8").read())
    for _ in range(rng.randint(1, 8)):
        at = rng.randrange(len(text) + 1)
        roll = rng.random()
        if roll < 0.35 and text:
            del text[min(at, len(text) - 1)]
        elif roll < 0.8:
            text.insert(at, rng.choice(pieces))
        else:
            to = rng.randrange(len(text) + 1)
            text[to:to] = text[at:at + rng.randint(1, 60)]
    ext = ".toml" if rng.random() < 0.3 else ".yaml"
    path = os.path.join(work, "mutant" + ext)
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(text))
    result = subprocess.run([binary, "validate", "--format", "json", path], capture_output=True, text=True)
    if result.returncode not in (0, 2) or "panicked" in result.stderr:
        crashes += 1
        keep = f"/tmp/archon-crash-{crashes}{ext}"
        with open(keep, "w", encoding="utf-8") as f:
            f.write("".join(text))
        print(f"crash (exit {result.returncode}), input kept in {keep}:\n{result.stderr[:500]}")
print(f"{runs} mutants, {crashes} crashes")
sys.exit(1 if crashes else 0)
