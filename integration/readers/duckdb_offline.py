"""DuckDB with its extensions loaded from the pinned duckdb-extension-*
packages (no download), for the readers of weir's tests."""

import glob
import importlib.util
import os


def connect(*extensions):
    """A DuckDB connection with `extensions` loaded, in that order."""
    import duckdb

    con = duckdb.connect(
        config={"autoinstall_known_extensions": False, "autoload_known_extensions": False}
    )
    for name in extensions:
        spec = importlib.util.find_spec(f"duckdb_extension_{name}")
        base = list(spec.submodule_search_locations)[0]
        found = glob.glob(os.path.join(base, "**", f"{name}.duckdb_extension"), recursive=True)
        if not found:
            raise SystemExit(f"the {name} extension file is missing under {base}")
        con.execute(f"LOAD '{found[0]}'")
    return con
