#!/usr/bin/env python3
"""Checks that each workspace crate's rust-version is the true minimum: at
least the highest rust-version among the crates it needs to build (normal
and build dependencies, transitively, as Cargo.lock resolves them).

    scripts/check-rust-version.py    # prints each crate's, exits 1 on a shortfall
"""

import json
import subprocess
import sys


def version(text):
    parts = [int(part) for part in text.split(".")] if text else []
    return tuple(parts + [0] * (3 - len(parts)))


def main():
    meta = json.loads(subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--locked"],
        check=True, capture_output=True, text=True).stdout)
    packages = {p["id"]: p for p in meta["packages"]}
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}

    def needs(root):
        seen, todo = set(), [root]
        while todo:
            node = todo.pop()
            if node in seen:
                continue
            seen.add(node)
            for dep in nodes[node]["deps"]:
                if any(k["kind"] != "dev" for k in dep["dep_kinds"]):
                    todo.append(dep["pkg"])
        seen.discard(root)
        return seen

    short = 0
    for member in meta["workspace_members"]:
        own = packages[member]
        deps = needs(member)
        top = max(deps, key=lambda d: version(packages[d].get("rust_version")), default=None)
        top_version = packages[top].get("rust_version") if top else None
        ok = version(own.get("rust_version")) >= version(top_version)
        short += not ok
        print(f"{own['name']}: rust-version {own.get('rust_version')}, its dependencies need "
              f"{top_version} ({packages[top]['name']} {packages[top]['version']})"
              + ("" if ok else "  <- declared too low"))
    if short:
        sys.exit(f"{short} crate(s) declare a rust-version below what their dependencies need")


if __name__ == "__main__":
    main()
