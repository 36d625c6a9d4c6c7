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


def with_test_s3(con):
    """Lets `con` read the test S3 (SeaweedFS) the environment names;
    httpfs must be loaded."""
    endpoint = os.environ["WEIR_TEST_S3_ENDPOINT"]
    scheme, _, host = endpoint.partition("://")
    con.execute(
        "CREATE SECRET weir_test_s3 (TYPE s3, KEY_ID ?, SECRET ?, REGION ?, ENDPOINT ?, URL_STYLE 'path', USE_SSL ?)",
        [
            os.environ["AWS_ACCESS_KEY_ID"],
            os.environ["AWS_SECRET_ACCESS_KEY"],
            os.environ.get("AWS_REGION", "us-east-1"),
            host,
            scheme == "https",
        ],
    )
    return con
