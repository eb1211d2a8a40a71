"""``python -m train.borrowed``: every touch of a library's internals, one line each (library, version, name,
upstream)."""

from __future__ import annotations

from train.borrowed.registry import TOUCHES


def main() -> None:
    for touch in sorted(TOUCHES, key=lambda t: (t.library, t.name)):
        print(f"{touch.library} {touch.version}  {touch.name}  ({touch.upstream})")


if __name__ == "__main__":
    main()
