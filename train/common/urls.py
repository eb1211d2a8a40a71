"""The URL grammar of stores: which output_dir or MLM_RESUME names an object store (``s3://``, ``gs://``, ...)
rather than a directory, and how such a URL is shown. Kept apart from train/outputs/store.py, which talks to the
store, so that the options (train/config) can resolve a URL without importing a store."""

from __future__ import annotations

import os
import re

LOCAL_PROTOCOLS = ("file", "local")
URL = re.compile(r"^(?P<protocol>[a-z][a-z0-9+.-]*)://", re.I)


def is_store_url(value: str | os.PathLike[str]) -> bool:
    """``value`` names an object store: a URL whose protocol fsspec has a filesystem for, other than file/local."""
    match = URL.match(os.fspath(value))
    if not match or match["protocol"].lower() in LOCAL_PROTOCOLS:
        return False
    import fsspec  # the library's own import cost, paid only when a URL is given

    return match["protocol"].lower() in fsspec.available_protocols()


def without_credentials(url: str) -> str:
    """``url`` as messages and run.json show it: a ``user:secret@`` after the protocol left out."""
    return re.sub(r"^([a-z][a-z0-9+.-]*://)[^/@]*@", r"\1", url, flags=re.I)
