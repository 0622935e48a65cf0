#!/usr/bin/env python3
"""Writes spec files at (or just past) each of `archon validate`'s limits into a folder, for
scripts/bench-validate.sh to measure validation's peak memory on each (docs/spec.md, "Limits").

usage: scripts/limits.py DIR
"""
import os
import sys

out = sys.argv[1]
MIB = 1024 * 1024
YAML_BYTES = 8 * MIB - 1024
TOML_BYTES = 512 * 1024 - 256


def write(name, text):
    with open(os.path.join(out, name), "w") as f:
        f.write(text)


def steps(n, line):
    return "".join(line.format(i=i) for i in range(n))


# YAML: the step limit (20,000 steps of a few values each), the value limit (a list of 499,000, and
# mappings of many keys), 8 MiB of blank lines and of comments, and a file just past the step limit.
write("yaml-steps.yaml", "name: big\nsteps:\n" + steps(20_000, "  - {{ id: s{i}, tool: echo, with: {{ v: {i}, w: [1, 2, 3], x: {{ a: b }} }} }}\n"))
write("yaml-steps-past.yaml", "name: big\nsteps:\n" + steps(20_001, "  - {{ id: s{i}, tool: echo }}\n"))
write("yaml-values.yaml", "name: big\nsteps:\n  - id: a\n    tool: echo\n    with:\n      v: [" + ",".join(["1"] * 499_000) + "]\n")
# Many keys in one mapping, up to the value limit: inputs (each a mapping of its own), and keys no
# workflow has (each an error, its diagnostic written as text and as JSON by bench-validate.sh).
write("yaml-keys.yaml", "name: big\ninputs:\n" + steps(124_000, "  x{i}: {{ type: string }}\n") + "steps:\n  - { id: a, tool: echo }\n")
write("yaml-repeated-keys.yaml", "name: big\nsteps:\n  - id: a\n    tool: echo\n    with:\n" + steps(120_000, "      k{i:06}: 1\n") + "      k119999: 1\n" * 120_000)
write("yaml-unknown-keys.yaml", "name: big\nsteps: []\n" + steps(240_000, "x{i}: 1\n"))
write("yaml-blank-lines.yaml", "name: x\nsteps: []\n" + "\n" * YAML_BYTES)
write("yaml-comments.yaml", "name: x\nsteps: []\n" + "#\n" * (YAML_BYTES // 2))
# TOML, up to its own size limit: as many steps as fit, a list of values, empty inline tables, blank
# lines and comments; and a file just past the size limit.
toml_steps, n = ["name = \"big\"\n"], 0
while sum(map(len, toml_steps)) < TOML_BYTES - 64:
    toml_steps.append(f'[[steps]]\nid = "s{n}"\ntool = "echo"\nwith = {{ v = {n} }}\n')
    n += 1
write("toml-steps.toml", "".join(toml_steps))
head = 'name = "big"\n[[steps]]\nid = "a"\ntool = "echo"\n[steps.with]\nv = ['
write("toml-values.toml", head + ",".join(["1"] * ((TOML_BYTES - 100) // 2)) + "]\n")
write("toml-tables.toml", head + ",".join(["{}"] * ((TOML_BYTES - 100) // 3)) + "]\n")
write("toml-blank-lines.toml", 'name = "x"\nsteps = []\n' + "\n" * TOML_BYTES)
write("toml-comments.toml", 'name = "x"\nsteps = []\n' + "#\n" * (TOML_BYTES // 2))
write("toml-past.toml", 'name = "x"\nsteps = []\n' + "\n" * (TOML_BYTES + 1024))
