#!/usr/bin/env python3
"""Generate a realistic N-step workflow spec (default 1,000) for benchmarks.

Steps mix built-in and declared tool calls with templates reading earlier steps, `needs`, `foreach`
fan-out, conditions, retries, LLM goal steps with output schemas, and rules.

usage: scripts/gen-spec.py [STEPS] > spec.yaml
"""
import random
import sys

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
rng = random.Random(7)

out = [
    "name: generated",
    "description: A generated workflow for benchmarks",
    "inputs:",
    "  repo_dir: { type: string, default: . }",
    "  limit: { type: integer, minimum: 1, default: 10 }",
    "secrets: [API_TOKEN]",
    "llm:",
    "  default: local",
    "  providers:",
    "    local: { kind: openai, base_url: \"http://127.0.0.1:8080/v1\", model: qwen2.5-7b-instruct }",
    "tools:",
    "  git_log:",
    "    description: List commit subjects",
    "    parameters:",
    "      type: object",
    "      properties: { limit: { type: integer }, path: { type: string } }",
    "      required: [limit]",
    "    command: [git, -C, \"{{ inputs.repo_dir }}\", log, -n, \"{{ limit }}\", --format=%s]",
    "    output: lines",
    "  api:",
    "    description: Call the internal API",
    "    parameters: { type: object, properties: { path: { type: string } }, required: [path] }",
    "    http:",
    "      url: \"http://127.0.0.1:9000/{{ path }}\"",
    "      headers: { Authorization: \"Bearer {{ secrets.API_TOKEN }}\" }",
    "steps:",
]
for i in range(steps):
    earlier = [f"s{j}" for j in rng.sample(range(i), min(i, rng.randint(0, 3)))] if i else []
    out.append(f"  - id: s{i}")
    kind = i % 10
    ref = f"{{{{ steps.{earlier[0]}.output }}}}" if earlier else "start"
    if kind == 3:
        out.append(f"    goal: \"Summarise {ref} in one line for {{{{ inputs.repo_dir }}}}\"")
        out.append("    output_schema: { type: object, properties: { line: { type: string } }, required: [line] }")
        out.append("    max_iterations: 5")
    elif kind == 5 and earlier:
        out.append(f"    foreach: steps.{earlier[0]}.output")
        out.append("    max_parallel: 4")
        out.append("    tool: echo")
        out.append(f"    with: {{ item: \"{{{{ item }}}}\", at: \"{{{{ index }}}}\" }}")
    elif kind == 7:
        out.append("    tool: git_log")
        out.append("    with: { limit: \"{{ inputs.limit }}\" }")
        out.append("    retry: { attempts: 3, backoff: exponential, delay: 500ms }")
    elif kind == 8:
        out.append("    tool: api")
        out.append(f"    with: {{ path: \"items/{i}\" }}")
        out.append("    timeout: 10s")
    else:
        out.append("    tool: exec")
        out.append(f"    with: {{ argv: [echo, \"{ref}\", \"step {i}\"], output: text }}")
    if len(earlier) > 1:
        out.append(f"    needs: [{', '.join(earlier[1:])}]")
    if kind == 9 and earlier:
        out.append(f"    if: steps.{earlier[0]}.status == 'succeeded'")
        out.append("    on_error: continue")
out += [
    "rules:",
    "  - on: before_tool",
    "    match: { tool: exec, chosen_by: llm }",
    "    action: ask",
    "  - on: before_tool",
    "    match: { tool: \"git_*\" }",
    "    action: log",
    "outputs:",
    f"  last: \"{{{{ steps.s{steps - 1}.output }}}}\"",
]
print("\n".join(out))
