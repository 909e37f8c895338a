#!/usr/bin/env python3
"""Compares the SASS of two CUDA fatbins function by function.

Usage:
    python3 scripts/sass-diff.py OLD.fatbin NEW.fatbin

Runs `cuobjdump -sass` on both (an NVIDIA machine has it; the pip nvcc
here does not, but the pip packages nvidia-cuda-cuobjdump and
nvidia-cuda-nvdisasm do: put both nvidia/cu13/bin folders on PATH),
splits the listing by architecture and function, compares each
function's listing exactly (instructions, encodings and offsets), and
prints one line per function: `same`, `changed`, `only old` or `only new`.
Exits 1 when a function that both have differs.
"""

import re
import subprocess
import sys


def functions(path):
    out = subprocess.run(["cuobjdump", "-sass", path], check=True, capture_output=True, text=True).stdout
    funcs = {}
    arch = "?"
    name = None
    body = []
    for line in out.splitlines():
        m = re.match(r"\s*arch = (sm_\d+\w*)", line)
        if m:
            # The previous architecture's last function ends here.
            if name:
                funcs[(arch, name)] = "\n".join(body)
            arch, name, body = m.group(1), None, []
            continue
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            if name:
                funcs[(arch, name)] = "\n".join(body)
            name, body = m.group(1), []
            continue
        if name is not None and line.strip():
            # Whitespace runs collapsed: cuobjdump pads columns to the
            # longest instruction of the whole listing.
            body.append(" ".join(line.split()))
    if name:
        funcs[(arch, name)] = "\n".join(body)
    return funcs


def main():
    old, new = functions(sys.argv[1]), functions(sys.argv[2])
    changed = 0
    for key in sorted(set(old) | set(new)):
        arch, name = key
        if key not in old:
            state = "only new"
        elif key not in new:
            state = "only old"
        elif old[key] == new[key]:
            state = "same"
        else:
            state = "changed"
            changed += 1
        print(f"{arch:7} {name:40} {state}")
    same = sum(1 for k in old if k in new and old[k] == new[k])
    print(f"sass-diff: {same} same, {changed} changed, "
          f"{len(set(new) - set(old))} only new, {len(set(old) - set(new))} only old")
    sys.exit(1 if changed else 0)


if __name__ == "__main__":
    main()
