"""What we borrow from fsspec (fsspec and s3fs 2026.9, ``fsspec/registry.py``): its registry of filesystems,
patched for this process so that datasets can read compressed files from S3. Nothing here imports fsspec or s3fs
until the patch is applied (s3fs brings aiobotocore)."""

from __future__ import annotations

from typing import Any

from train.borrowed.touch import borrows

# What datasets 5.2's compressed-file reader hands every filesystem (filesystems/compression.py
# BaseCompressedFileFileSystem): aiohttp's options, which s3fs passes to aiobotocore, which rejects them.
HTTP_CLIENT_OPTIONS = ("requote_redirect_url", "trust_env")


@borrows("fsspec", "2026.9", "registry.py register_implementation (s3, s3a), s3fs core.py S3FileSystem")
def s3_ignores_http_client_options() -> None:
    """Let s3fs read the compressed files of a stream. datasets 5.2's decompressing filesystem
    (``filesystems/compression.py``, ``BaseCompressedFileFileSystem``) hands aiohttp's ``client_kwargs``
    (``requote_redirect_url``, ``trust_env``) to whichever filesystem holds the file, and s3fs 2026.9 (``core.py``,
    ``S3FileSystem``) passes them on to aiobotocore, which rejects them (huggingface/datasets issue 7295, open).
    s3:// and s3a:// are served by an S3FileSystem that drops those two, meaningless for S3: a patch of fsspec
    2026.9's registry (``registry.py``, ``register_implementation(..., clobber=True)``) for this process and the
    DataLoader workers it forks. Neither datasets nor s3fs has an option to leave them out."""
    import fsspec  # the libraries' own imports, paid only when a stream reads from S3
    import s3fs

    class S3FileSystem(s3fs.S3FileSystem):
        def __init__(self, *args: Any, client_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> None:
            kept = {k: v for k, v in (client_kwargs or {}).items() if k not in HTTP_CLIENT_OPTIONS}
            super().__init__(*args, client_kwargs=kept, **kwargs)

    for protocol in ("s3", "s3a"):
        fsspec.register_implementation(protocol, S3FileSystem, clobber=True)
