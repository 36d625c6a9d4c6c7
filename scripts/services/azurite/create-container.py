"""Creates a blob container in Azurite with its well-known development
account (Shared Key), using only Python's standard library.

    create-container.py http://127.0.0.1:PORT CONTAINER
"""

import base64
import hashlib
import hmac
import sys
import urllib.error
import urllib.request
from email.utils import formatdate

ACCOUNT = "devstoreaccount1"
# Azurite's published development key: not a secret.
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
VERSION = "2021-08-06"


def main(endpoint: str, container: str) -> None:
    date = formatdate(usegmt=True)
    # Verb, eleven standard headers (all empty here), the x-ms- headers,
    # then the resource: path-style, so the account appears twice.
    to_sign = "\n".join(
        ["PUT"]
        + [""] * 11
        + [f"x-ms-date:{date}", f"x-ms-version:{VERSION}"]
        + [f"/{ACCOUNT}/{ACCOUNT}/{container}\nrestype:container"]
    )
    signature = base64.b64encode(
        hmac.new(base64.b64decode(KEY), to_sign.encode(), hashlib.sha256).digest()
    ).decode()
    request = urllib.request.Request(
        f"{endpoint}/{ACCOUNT}/{container}?restype=container",
        method="PUT",
        headers={
            "x-ms-date": date,
            "x-ms-version": VERSION,
            "Authorization": f"SharedKey {ACCOUNT}:{signature}",
            "Content-Length": "0",
        },
    )
    try:
        urllib.request.urlopen(request, timeout=10)
    except urllib.error.HTTPError as e:
        if e.code != 409:  # already there
            sys.exit(f"cannot create container {container}: {e.code} {e.read()[:300]!r}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
